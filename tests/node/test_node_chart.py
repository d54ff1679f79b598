"""The chart's node agent mounts what the agent's code opens under the kubelet's root
directory, each as it uses it, and nothing else of the kubelet's: not its credentials
(pki/, kubeconfig), nor the device plugins' sockets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from testing.chart import ALL_ON, by_kind, render
from throttledjob.contracts.names import NODE_CSI_DRIVER
from throttledjob.node.csi import socket_paths
from throttledjob.node.pod_resources import socket_path as pod_resources_socket

POD_UID = "8b1f7f4e-0000-4000-8000-00000000000a"


def mount_of(mounts: list[dict[str, Any]], path: Path) -> dict[str, Any] | None:
    """The mount a path is reached through (the deepest one over it)."""
    over = [m for m in mounts if path.is_relative_to(m["mountPath"])]
    return max(over, key=lambda m: len(m["mountPath"]), default=None)


@pytest.mark.parametrize("kubelet_dir", ["/var/lib/kubelet", "/var/lib/k0s/kubelet"])
def test_the_node_agent_mounts_what_its_code_opens_and_no_more(tmp_path, kubelet_dir):
    values = {**ALL_ON, "gpu": {"nodeAgent": {**ALL_ON["gpu"]["nodeAgent"],
                                              "kubeletDir": kubelet_dir}}}
    (ds,) = by_kind(render(values, tmp_path), "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = container["volumeMounts"]
    root = Path(kubelet_dir)
    endpoint, registration = socket_paths(root)
    # Where the kubelet has a CSI driver publish a pod's ephemeral volume.
    published = root / "pods" / POD_UID / "volumes" / "kubernetes.io~csi" / "agent" / "mount"
    for made in (endpoint, registration, published):
        mount = mount_of(mounts, made)
        assert mount is not None and not mount.get("readOnly"), made
    dialled = mount_of(mounts, pod_resources_socket(root))
    assert dialled is not None and dialled.get("readOnly") is True
    # Nothing over the kubelet's root itself: each mount is one of its directories.
    assert not any(root.is_relative_to(m["mountPath"]) for m in mounts), mounts
    # Each mount is the host's own directory at the same path (the kubelet passes host
    # paths: a pod's target, its own endpoint).
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert all(host[m["name"]] == m["mountPath"] for m in mounts
               if m["mountPath"].startswith(kubelet_dir)), (host, mounts)
    # The probe looks where the driver's socket is.
    assert str(endpoint) in container["livenessProbe"]["exec"]["command"]


@pytest.mark.parametrize(("admission", "rbac", "jobset"), [
    (True, True, False), (True, True, True), (True, False, False), (False, True, False)])
def test_the_agents_volume_is_kept_to_the_operators_pods(tmp_path, admission, rbac, jobset):
    """With admission on, a policy refuses the agent's driver to anyone who may not "use"
    nodeagentvolumes; the chart grants that to the operator, the Job controller and (with
    JobSet) the JobSet controller, and leaves the grant to you without rbac.create."""
    values = {**ALL_ON, "admission": {"enabled": admission}, "rbac": {"create": rbac},
              "jobset": {"enabled": jobset}}
    objs = render(values, tmp_path)
    policies = [p for p in by_kind(objs, "ValidatingAdmissionPolicy")
                if p["metadata"]["name"].endswith("-node-agent-volume")]
    if not admission:
        assert policies == []
        return
    (policy,) = policies
    (check,) = policy["spec"]["validations"]
    assert "nodeagentvolumes" in check["expression"]
    assert all(f"driver == '{NODE_CSI_DRIVER}'" in v["expression"]
               for v in policy["spec"]["variables"] if v["name"].startswith("mount"))
    bindings = [b for b in by_kind(objs, "ClusterRoleBinding")
                if b["metadata"]["name"] == policy["metadata"]["name"]]
    if not rbac:
        assert bindings == []
        return
    (binding,) = bindings
    (account,) = by_kind(objs, "ServiceAccount")
    subjects = {(s["kind"], s.get("namespace"), s["name"]) for s in binding["subjects"]}
    assert ("ServiceAccount", account["metadata"]["namespace"],
            account["metadata"]["name"]) in subjects
    assert ("ServiceAccount", "kube-system", "job-controller") in subjects
    assert (("ServiceAccount", "jobset-system", "jobset-controller-manager")
            in subjects) is jobset
