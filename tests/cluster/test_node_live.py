"""A real node (tools/k8s/node.py): the kubelet on containerd and runc runs the product's
image, built from the project's Dockerfile, as a real pod, under Pod Security
"restricted", in a network namespace of its own. A pod that names no node lands there;
`kubectl logs`, `logs -f` and `exec` reach it through the API server, which alone may
call the kubelet.

Needs root and Debian's containerd, runc, containernetworking-plugins, podman and
debootstrap: without them the tests skip, or fail under CI=true (as require_tool does).
The first run builds the images (about 5 minutes: debootstrap, then the Dockerfile with
pip); later runs take them from ~/.cache/throttledjob/images.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
import subprocess
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

import throttledjob
from testing.cluster_cli import Kubectl, wait_json
from tools.k8s import cluster as k8s
from tools.k8s import host, images
from tools.k8s import node as node_mod

# A cold start (no cached images) runs debootstrap and the image build inside the first
# test's setup (the real_node fixture).
pytestmark = pytest.mark.timeout(1200)
POD_TIMEOUT = 120.0
# What the pod prints: who it runs as, its network interfaces, the product's version;
# then it exits with the code the test asked for.
SCRIPT = """
import os, sys, throttledjob
print("uid", os.getuid())
print("interfaces", " ".join(sorted(os.listdir("/sys/class/net"))))
print("version", throttledjob.__version__)
sys.exit(int(sys.argv[1]))
"""


def pod_manifest(namespace: str, exit_code: int, script: str = SCRIPT) -> dict[str, Any]:
    """A pod of the product image running `script`, with no node selector or toleration:
    the scheduler's choice alone puts it on the real node."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"real-{uuid.uuid4().hex[:6]}", "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "main", "image": images.PRODUCT_IMAGE,
                # Loaded into containerd by hand: there is no registry to pull from.
                "imagePullPolicy": "Never",
                "command": ["python", "-c", script, str(exit_code)],
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "securityContext": {"allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }


def run_pod(kubectl: Kubectl, namespace: str, exit_code: int) -> dict[str, Any]:
    pod = pod_manifest(namespace, exit_code)
    kubectl.apply(pod)
    name = pod["metadata"]["name"]
    return wait_json(kubectl, lambda p: p["status"].get("phase") in ("Succeeded", "Failed"),
                     "pod", "-n", namespace, name, what=f"pod {name} to finish",
                     timeout=POD_TIMEOUT)


def terminated(pod: dict[str, Any]) -> dict[str, Any]:
    (status,) = pod["status"]["containerStatuses"]
    return status["state"]["terminated"]


def test_a_real_pod_runs_the_image_to_success(real_node: Any, kubectl: Kubectl,
                                               namespace: str) -> None:
    pod = run_pod(kubectl, namespace, 0)
    assert pod["spec"]["nodeName"] == node_mod.NODE_NAME
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    state = terminated(pod)
    assert state["exitCode"] == 0 and state["reason"] == "Completed", state
    assert state["startedAt"] <= state["finishedAt"]
    out = kubectl("logs", "-n", namespace, pod["metadata"]["name"]).stdout
    lines = dict(line.split(" ", 1) for line in out.splitlines())
    assert lines["uid"] == "65532", out  # the image's USER, as "restricted" requires
    assert lines["version"] == throttledjob.__version__, out
    # Its own network namespace (the veth end of the node's bridge and lo, not the
    # machine's interfaces), with an IP from the bridge's subnet.
    assert lines["interfaces"].split() == ["eth0", "lo"], out
    assert sorted(os.listdir("/sys/class/net")) != ["eth0", "lo"]
    subnet = ipaddress.ip_network(k8s.Cluster(real_node.cluster.dir).state["node"]["subnet"])
    assert ipaddress.ip_address(pod["status"]["podIP"]) in subnet, pod["status"]


def test_the_pods_gateway_keeps_its_mac_address_when_pods_come_and_go(
        real_node: Any, kubectl: Kubectl, namespace: str) -> None:
    """The bridge's MAC is set, not the kernel's pick: a pick follows the lowest MAC of
    the bridge's ports, so a pod's exit could change the gateway's MAC under the other
    pods, whose cached ARP entry then sent their new connections nowhere for about 30 s
    (an operator's calls to the API server timed out after a test pod ended)."""
    node = k8s.Cluster(real_node.cluster.dir).state["node"]
    bridge = Path("/sys/class/net") / node["bridge"]
    # Set by node.py (NET_ADDR_SET), so the kernel never changes it; a node made before
    # this was fixed has none: `python -m tools.k8s.cluster down` and up again.
    assert (bridge / "addr_assign_type").read_text().strip() == "3", node
    pod = run_pod(kubectl, namespace, 0)
    kubectl("delete", "pod", "-n", namespace, pod["metadata"]["name"], "--wait=true")
    assert (bridge / "address").read_text().strip() == node["bridge_mac"]


def test_a_real_pod_failing_reports_its_exit_code_and_output(real_node: Any, kubectl: Kubectl,
                                                             namespace: str) -> None:
    pod = run_pod(kubectl, namespace, 3)
    assert pod["status"]["phase"] == "Failed", pod["status"]
    state = terminated(pod)
    assert state["exitCode"] == 3 and state["reason"] == "Error", state
    # The kubelet read the container's real output back as the termination message.
    assert "uid 65532" in state.get("message", ""), state


def test_the_node_and_its_control_plane_share_one_weighted_cgroup(real_node: Any) -> None:
    """The node's pods, every daemon of the cluster and this test run sit under the
    cluster's own cpu cgroup (cluster.CPU_SHARES), so a busy process beside the suite
    takes a ninth of a core from them, not half the machine."""
    state = k8s.Cluster(real_node.cluster.dir).state
    mount = next(m for m in host.cgroup_mounts() if "cpu" in m.name.split(","))
    top = mount / state["cgroup"].lstrip("/")
    assert state["cgroup"] and int((top / "cpu.shares").read_text()) == k8s.CPU_SHARES
    daemons = {int(p) for p in (top / "system" / "cgroup.procs").read_text().split()}
    assert {state["pids"][d] for d in ("kube-apiserver", "etcd", "kubelet")} <= daemons
    assert os.getpid() in daemons  # this test too (conftest.at_the_clusters_weight)
    # The kubelet's pods (kubepods, made by the kubelet itself) under it too.
    pods = state["node"]["cgroup_root"]
    assert pods.startswith(state["cgroup"] + "/"), pods
    assert (mount / pods.lstrip("/") / "kubepods").is_dir(), pods


# Waits for a word that only `kubectl exec` can give it, then says it and exits.
WAITING = """
import pathlib, sys, time
print("waiting", flush=True)
go = pathlib.Path("/work/go")
deadline = time.monotonic() + 90
while not go.exists():
    if time.monotonic() > deadline:
        sys.exit("nobody wrote /work/go")
    time.sleep(0.1)
print("got", go.read_text().strip(), flush=True)
"""


def test_logs_follow_and_exec_reach_a_real_pod(real_node: Any, kubectl: Kubectl,
                                                namespace: str) -> None:
    pod = pod_manifest(namespace, 0, WAITING)
    pod["spec"]["volumes"] = [{"name": "work", "emptyDir": {}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "work", "mountPath": "/work"}]
    name = pod["metadata"]["name"]
    kubectl.apply(pod)
    wait_json(kubectl, lambda p: p["status"].get("phase") == "Running", "pod", "-n",
              namespace, name, what=f"pod {name} Running", timeout=POD_TIMEOUT)
    # `logs -f` streams what the running container writes, and ends when it does.
    follow = subprocess.Popen(
        [str(k8s.bin_dir() / "kubectl"), "--kubeconfig", str(kubectl.kubeconfig), "logs",
         "-f", "-n", namespace, name], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        assert follow.stdout is not None
        assert follow.stdout.readline() == "waiting\n"
        exec_ = ["exec", "-n", namespace, name, "--"]
        who = kubectl(*exec_, "python", "-c", "import os; print(os.getuid(), os.getpid())")
        uid, pid = who.stdout.split()
        assert uid == "65532" and pid != "1", who.stdout  # a new process in the container
        failed = kubectl(*exec_, "sh", "-c", "echo oops >&2; exit 7", check=False)
        assert failed.returncode == 7 and "oops" in failed.stderr, failed
        kubectl(*exec_, "sh", "-c", "echo hello > /work/go")
        rest, err = follow.communicate(timeout=POD_TIMEOUT)
    finally:
        follow.kill()
        follow.wait()
    assert follow.returncode == 0, err
    assert rest == "got hello\n", (rest, err)
    done = wait_json(kubectl, lambda p: p["status"].get("phase") in ("Succeeded", "Failed"),
                     "pod", "-n", namespace, name, what=f"pod {name} to finish")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert kubectl("logs", "-n", namespace, name).stdout == "waiting\ngot hello\n"


def test_the_kubelet_serves_tls_of_the_cluster_ca_and_asks_the_api_server_who_may_call(
        real_node: Any, kubectl: Kubectl, namespace: str) -> None:
    """The kubelet listens on the node's IP only, with a certificate of the cluster's CA
    for that IP; nobody anonymous gets in, and a token gets in only as far as the API
    server's RBAC says (webhook authentication and authorization)."""
    cluster = k8s.Cluster(real_node.cluster.dir)
    node = kubectl.json("get", "node", node_mod.NODE_NAME)
    (ip,) = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
    assert ip == cluster.state["node"]["gateway"], node["status"]["addresses"]
    port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
    ca = ssl.create_default_context(cafile=str(cluster.dir / "certs" / "ca.crt"))

    def status(token: str | None) -> int:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        req = urllib.request.Request(f"https://{ip}:{port}/pods", headers=headers)
        try:  # the certificate is checked for the IP (ssl's hostname check)
            with urllib.request.urlopen(req, timeout=10, context=ca) as resp:
                return resp.status
        except urllib.error.HTTPError as e:
            return e.code

    assert status(None) == 401
    kubectl("create", "serviceaccount", "-n", namespace, "nobody")
    assert status(cluster.service_account_token(namespace, "nobody")) == 403
    assert status(cluster.admin_token) == 200
    # Nothing listens on the machine's other addresses, loopback included.
    assert not host.listening("127.0.0.1", port)
