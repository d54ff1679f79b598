"""The chart's node agent mounts what the agent's code opens under the kubelet's root
directory, each as it uses it, and nothing else of the kubelet's: not its credentials
(pki/, kubeconfig), nor the device plugins' sockets."""

from __future__ import annotations

import json
import re
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


def named_users(policy: dict[str, Any]) -> set[str]:
    """The usernames the rendered policy's `named` variable lists (a CEL list literal)."""
    (named,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == "named"]
    listed = re.fullmatch(r"request\.userInfo\.username in \[(.*)\]", named.strip())
    assert listed, named
    return set(re.findall(r"'([^']*)'", listed.group(1)))


@pytest.mark.parametrize(("admission", "jobset", "extra"), [
    (True, False, []), (True, True, ["system:serviceaccount:kueue-system:kueue"]),
    (False, False, [])])
def test_the_agents_volume_is_kept_to_named_identities(tmp_path, admission, jobset, extra):
    """With admission on, a policy refuses the agent's driver to anyone but the named
    identities: the operator, the Job controller, the JobSet controller with JobSet, and
    gpu.nodeAgent.volumeUsers. No authorizer check (a wildcard Role passes one) and no
    RBAC grant of the volume is rendered."""
    values = {**ALL_ON, "admission": {"enabled": admission}, "jobset": {"enabled": jobset},
              "gpu": {"nodeAgent": {**ALL_ON["gpu"]["nodeAgent"], "volumeUsers": extra}}}
    objs = render(values, tmp_path)
    policies = [p for p in by_kind(objs, "ValidatingAdmissionPolicy")
                if p["metadata"]["name"].endswith("-node-agent-volume")]
    assert "nodeagentvolumes" not in str(objs)
    if not admission:
        assert policies == []
        return
    (policy,) = policies
    (account,) = by_kind(objs, "ServiceAccount")
    operator = (f"system:serviceaccount:{account['metadata']['namespace']}:"
                f"{account['metadata']['name']}")
    expected = {operator, "system:serviceaccount:kube-system:job-controller",
                "system:kube-controller-manager", *extra}
    if jobset:
        expected.add("system:serviceaccount:jobset-system:jobset-controller-manager")
    assert named_users(policy) == expected
    (check,) = policy["spec"]["validations"]
    assert check["expression"] == "!(variables.adds || variables.debugs) || variables.named"
    assert "authorizer" not in json.dumps(policy)
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert f"v.csi.driver == '{NODE_CSI_DRIVER}'" in variables["adds"]
    assert "ephemeralContainers" in variables["debugs"]
    judged = {r for rule in policy["spec"]["matchConstraints"]["resourceRules"]
              for r in rule["resources"]}
    assert judged == {"pods", "pods/ephemeralcontainers", "replicationcontrollers", "jobs",
                      "cronjobs", "deployments", "replicasets", "statefulsets",
                      "daemonsets", "jobsets", "throttledjobs"}


def test_the_agent_is_probed_through_its_driver_and_evicted_last(tmp_path):
    (ds,) = by_kind(render(ALL_ON, tmp_path), "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    endpoint, _ = socket_paths(Path("/var/lib/kubelet"))
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["exec"]["command"] == [
            "python", "-m", "throttledjob.node.probe", str(endpoint)], probe
    assert pod["priorityClassName"] == "system-node-critical"
    assert "--metrics-pod-names" not in container["args"]

