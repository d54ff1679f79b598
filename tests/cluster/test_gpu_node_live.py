"""GPUs on the test cluster as a real cluster gets them: a device plugin registers two fake
`nvidia.com/gpu` (tools/k8s/fake_gpus.py, the simulated board's UUIDs) with the real
node's kubelet; pods request them as on a GPU node, the kubelet allocates them, and its
PodResources API says which pod holds which (what the GPU node agent reads:
node/pod_resources.py)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from testing.cluster_cli import Kubectl, wait_json
from testing.helpers import wait_for
from testing.paths import VENV_BIN
from throttledjob.contracts.names import NODE_POWER_CAP_ATTRIBUTE
from throttledjob.gpu.fake import TDP_WATTS, fake_uuid
from throttledjob.node.csi import EPHEMERAL, POD_INFO
from throttledjob.node.pod_resources import gpus_by_pod
from throttledjob.node.process import TIDY_SECONDS
from tools.k8s import images
from tools.k8s import node as node_mod

pytestmark = pytest.mark.timeout(600)
POD_TIMEOUT = 120.0


@pytest.fixture(scope="module")
def fake_gpus(real_node: Any) -> Any:
    """Two fake GPUs on the real node, left registered for the session: the node's
    allocatable count lags a plugin's stop by a status update, so a plugin stopped and
    started again looks ready before it has registered."""
    real_node.start_fake_gpus(2)
    return real_node


def gpu_pod(namespace: str) -> dict[str, Any]:
    """A pod of the product image asking for one GPU, printing the GPU it was given."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"gpu-{uuid.uuid4().hex[:6]}", "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,   # python as PID 1 ignores SIGTERM
            "securityContext": {"runAsNonRoot": True,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "main", "image": images.PRODUCT_IMAGE, "imagePullPolicy": "Never",
                "command": ["python", "-c", "import os, time; "
                            "print(os.environ.get('NVIDIA_VISIBLE_DEVICES'), flush=True); "
                            "time.sleep(300)"],
                "resources": {"limits": {"nvidia.com/gpu": 1}},
                "securityContext": {"allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }


def test_pods_get_the_fake_gpus_and_the_kubelet_says_which_pod_holds_which(
        fake_gpus: Any, kubectl: Kubectl, namespace: str) -> None:
    pods = [gpu_pod(namespace) for _ in range(3)]
    for pod in pods:
        kubectl.apply(pod)
    names = [p["metadata"]["name"] for p in pods]
    for name in names[:2]:
        wait_json(kubectl, lambda p: p["status"].get("phase") == "Running", "pod", "-n",
                  namespace, name, what=f"pod {name} running", timeout=POD_TIMEOUT)
    # Two GPUs: the third waits for one, as on a node whose GPUs are all taken.
    third = wait_json(kubectl, lambda p: any(
        c["type"] == "PodScheduled" and c["status"] == "False"
        for c in p["status"].get("conditions") or []), "pod", "-n", namespace, names[2],
        what="the third pod unschedulable", timeout=POD_TIMEOUT)
    assert "nvidia.com/gpu" in str(third["status"]["conditions"]), third["status"]

    held = gpus_by_pod(fake_gpus.pod_resources_socket)
    mine = {name: held.get(f"{namespace}/{name}") for name in names}
    assert {mine[names[0]], mine[names[1]]} == {frozenset({fake_uuid(0)}),
                                                frozenset({fake_uuid(1)})}, held
    assert mine[names[2]] is None
    for name in names[:2]:   # each container told its own GPU, as NVIDIA's plugin tells it
        told = kubectl("logs", "-n", namespace, name).stdout.split()
        assert told == sorted(mine[name]), (name, told)
    for name in names:
        kubectl("delete", "pod", "-n", namespace, name, "--wait=false")


# What a pod's process says to the node agent, in the protocol's own words (stdlib only:
# node/socket_protocol.py): its GPUs, then a cap of its own GPU and one of the other GPU.
ASK_AGENT = """
import json, socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect("/run/throttledjob/node/agent.sock")
f = s.makefile("rb")
def ask(request):
    s.sendall(json.dumps(request).encode() + b"\\n")
    return json.loads(f.readline())
read = ask({"op": "read"})
for _ in range(100):   # as the sidecar does: the kubelet's word on a new pod comes late
    if "gpus" in read:
        break
    time.sleep(0.2)
    read = ask({"op": "read"})
mine = [g["uuid"] for g in read["gpus"]]
other = next(u for u in sys.argv[1:] if u not in mine)
try:   # the volume is read-only: the agent's directory, not the pod's
    open("/run/throttledjob/node/filler", "wb").close()
    write = 0
except OSError as e:
    write = e.errno
print(json.dumps({"mine": mine,
                  "range": ask({"op": "range", "uuid": mine[0]}),
                  "cap": ask({"op": "set_power_limit", "uuid": mine[0], "watts": 150}),
                  "other": ask({"op": "set_power_limit", "uuid": other, "watts": 150}),
                  "write": write}),
      flush=True)
time.sleep(300)
"""
# Another pod's process on a pod's socket (a hostPath to its volume, in a namespace that
# allows one): it reads nothing, caps nothing.
INTRUDE = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1] + "/agent.sock")
s.sendall(b'{"op": "read"}\\n')
print(s.makefile("rb").readline().decode(), flush=True)
"""
CSI_DRIVER = {
    "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
    "metadata": {"name": "node.throttledjob.io"},
    "spec": {"attachRequired": False, "podInfoOnMount": True,
             "volumeLifecycleModes": ["Ephemeral"], "fsGroupPolicy": "None"},
}


@pytest.fixture
def node_agent(fake_gpus: Any, kubectl: Kubectl, tmp_path: Path) -> Iterator[Any]:
    """`throttledjob node` on the real node, as the chart's DaemonSet runs it: the
    simulated board with the fake device plugin's UUIDs; its CSI driver registered."""
    kubectl.apply(CSI_DRIVER)
    agent = NodeAgentProcess(fake_gpus.dir / "kubelet", tmp_path / "state", tmp_path / "log")
    yield agent
    agent.stop()
    # Cluster-wide: the chart's node agent (tests/cluster/test_gpu_operator_live.py)
    # installs its own.
    kubectl("delete", "csidriver", CSI_DRIVER["metadata"]["name"])


class NodeAgentProcess:
    def __init__(self, kubelet_dir: Path, state_dir: Path, log: Path) -> None:
        self.metrics_port = free_port()
        self.args = [str(VENV_BIN / "throttledjob"), "node", "--gpu-backend", "fake",
                     "--node-name", node_mod.NODE_NAME, "--kubelet-dir", str(kubelet_dir),
                     "--state-dir", str(state_dir), "--metrics-port", str(self.metrics_port)]
        self.state, self.log = state_dir, log
        self.board = state_dir.parent / "simulated-board.json"
        self.start()

    def start(self) -> None:
        # The simulated boards keep their limits in a file, as a real board keeps its
        # limit whatever becomes of the process that set it.
        env = {**os.environ, "THROTTLEDJOB_FAKE_GPUS": "2",
               "THROTTLEDJOB_FAKE_GPU_TRACE": "steady",
               "THROTTLEDJOB_FAKE_GPU_LIMITS_FILE": str(self.board)}
        with open(self.log, "ab") as out:
            # The open-file limit a container often gets (1,024 soft and hard): the flood
            # below took every descriptor of an agent so limited.
            self.proc = subprocess.Popen(self.args, env=env, stdout=out, stderr=out,
                                         preexec_fn=lambda: resource.setrlimit(
                                             resource.RLIMIT_NOFILE, (1024, 1024)))

    def caps(self) -> dict[str, tuple[float, str]]:
        """GPU UUID -> (its limit before the cap, the pod that asked), as on record."""
        path = self.state / "caps.json"
        caps = json.loads(path.read_text())["caps"] if path.exists() else {}
        return {uuid: (c["original_watts"], c["pod"]) for uuid, c in caps.items()}

    def limit(self, uuid: str) -> float:
        """The simulated board's power limit in force."""
        limits = json.loads(self.board.read_text()) if self.board.exists() else []
        index = next(i for i in (0, 1) if fake_uuid(i) == uuid)
        return limits[index] if index < len(limits) else TDP_WATTS

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(timeout=30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Attributes a pod's author may write, of the names the kubelet gives the agent: the
# kubelet writes its own over them (the pod's, and "true" for an inline volume).
FORGED = {POD_INFO + "namespace": "kube-system", POD_INFO + "name": "someone-else",
          POD_INFO + "uid": "00000000-0000-0000-0000-000000000000", EPHEMERAL: "false"}


def agent_pod(namespace: str, read_only: bool = True, forged: bool = False) -> dict[str, Any]:
    pod = gpu_pod(namespace)
    (container,) = pod["spec"]["containers"]
    container["command"] = ["python", "-c", ASK_AGENT, fake_uuid(0), fake_uuid(1)]
    container["volumeMounts"] = [{"name": "node-agent", "mountPath": "/run/throttledjob/node"}]
    # As the operator makes it for a ThrottledJob that allows the cap: the real kubelet
    # passes the attribute on to the agent, which refuses a cap without it.
    pod["spec"]["volumes"] = [{"name": "node-agent", "csi": {
        "driver": CSI_DRIVER["metadata"]["name"], "readOnly": read_only,
        "volumeAttributes": {NODE_POWER_CAP_ATTRIBUTE: "true", **(FORGED if forged else {})}}}]
    return pod


def said(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    def line() -> str:
        return kubectl("logs", "-n", namespace, name, check=False).stdout.strip()
    deadline = time.monotonic() + POD_TIMEOUT
    while not line() and time.monotonic() < deadline:
        time.sleep(0.5)
    return json.loads(line())


def test_a_pod_reads_and_caps_its_own_gpu_through_its_csi_volume_and_the_cap_goes_with_it(
        node_agent: Any, fake_gpus: Any, kubectl: Kubectl, namespace: str) -> None:
    """Under Pod Security "restricted": the pod reaches the agent through its CSI volume,
    sees its own GPU and no other, caps it (kept in the agent's state with the original
    limit), is refused the other GPU; neither the agent SIGKILLed while the cap is in
    force and started again nor the kubelet restarted takes the cap off the running pod;
    when the pod is deleted, the cap is put back, once. The pod's volume names another
    pod and a PersistentVolume in its attributes: the kubelet's own keys win, and the
    agent serves and keys the cap by the real pod."""
    pod = agent_pod(namespace, forged=True)
    kubectl.apply(pod)
    name = pod["metadata"]["name"]
    answers = said(kubectl, namespace, name)
    (gpu,) = answers["mine"]
    assert gpu in (fake_uuid(0), fake_uuid(1))
    assert answers["cap"] == {"watts": 150}
    assert "not this pod's" in answers["other"]["error"], answers
    assert answers["write"] == errno.EROFS, answers
    assert node_agent.caps() == {gpu: (TDP_WATTS, f"{namespace}/{name}")}
    assert node_agent.limit(gpu) == 150

    node_agent.stop(signal.SIGKILL)   # the cap stays in force; its record on disk
    node_agent.start()
    # The kubelet restarted under the agent: PodResources gone and back. The pod runs on,
    # so its cap stays, past the agent's tidying passes; nothing is put back.
    fake_gpus.cluster.restart("kubelet")
    key = f"{namespace}/{name}"
    deadline = time.monotonic() + POD_TIMEOUT
    while time.monotonic() < deadline:
        with contextlib.suppress(grpc.RpcError):
            if key in gpus_by_pod(fake_gpus.pod_resources_socket):
                break
        time.sleep(0.5)
    else:
        raise AssertionError("the restarted kubelet never listed the pod's GPU again")
    time.sleep(2 * TIDY_SECONDS)
    assert node_agent.caps() == {gpu: (TDP_WATTS, key)}
    assert node_agent.limit(gpu) == 150
    kubectl("delete", "pod", "-n", namespace, name, "--wait=true", "--timeout=90s")
    deadline = time.monotonic() + 60
    while node_agent.caps() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert node_agent.caps() == {}, node_agent.log.read_text()[-2000:]
    assert node_agent.log.read_text().count(f"GPU {gpu} back to {TDP_WATTS:.0f} W") == 1
    assert node_agent.limit(gpu) == TDP_WATTS


def events_of(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    return kubectl.json("get", "events", "-n", namespace, "--field-selector",
                        f"involvedObject.name={name}")["items"]


def test_a_tenant_cannot_write_the_volume_use_anothers_socket_or_stop_a_restore(
        node_agent: Any, fake_gpus: Any, kubectl: Kubectl, namespace: str) -> None:
    """docs/reliability.md's threat model on the real node, as tenants try it: the volume
    mounted read-only (a pod asking for it writable never starts, and says why); a pod of
    another namespace given a pod's socket by a hostPath is refused (the kubelet's real
    cgroups name its pod); and the agent, limited to 1,024 open files, flooded with more
    connections than that on its metrics port while the capped pod ends, puts the cap
    back (the flood once took every descriptor before the restore); the next pod given
    a GPU finds its own limit as the original."""
    pod = agent_pod(namespace)
    kubectl.apply(pod, agent_pod(namespace, read_only=False) | {
        "metadata": {"name": "writable", "namespace": namespace}})
    name = pod["metadata"]["name"]
    answers = said(kubectl, namespace, name)
    (gpu,) = answers["mine"]
    assert answers["cap"] == {"watts": 150} and node_agent.limit(gpu) == 150
    # The agent's refusal, in the pod's events (a first FailedMount may be the kubelet's
    # own, before it has registered the agent's driver: it retries).
    wait_for(lambda: [e["message"] for e in events_of(kubectl, namespace, "writable")
                      if e["reason"] == "FailedMount" and "read-only" in e["message"]],
             POD_TIMEOUT, interval=0.5, what="the writable volume's publish refused")
    assert kubectl.json("get", "pod", "-n", namespace, "writable")["status"]["phase"] == "Pending"
    kubectl("delete", "pod", "-n", namespace, "writable", "--wait=false")

    uid = kubectl.json("get", "pod", "-n", namespace, name)["metadata"]["uid"]
    volume = fake_gpus.dir / "kubelet" / "pods" / uid / "volumes" / "kubernetes.io~csi" / \
        "node-agent" / "mount"
    other = f"intruder-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", other)
    try:
        kubectl.apply({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": "intruder", "namespace": other},
                       "spec": {"restartPolicy": "Never", "containers": [{
                           "name": "main", "image": images.PRODUCT_IMAGE,
                           "imagePullPolicy": "Never",
                           "command": ["python", "-c", INTRUDE, "/agent"],
                           "volumeMounts": [{"name": "agent", "mountPath": "/agent"}]}],
                           "volumes": [{"name": "agent", "hostPath": {
                               "path": str(volume), "type": "Directory"}}]}})
        answer = json.loads(wait_for(lambda: kubectl(
            "logs", "-n", other, "intruder", check=False).stdout.strip(), POD_TIMEOUT,
            interval=0.5, what="the intruder's answer"))
        assert answer == {"error": "this socket is another pod's"}, answer
    finally:
        kubectl("delete", "namespace", other, "--wait=false")
    assert node_agent.limit(gpu) == 150

    flood = []
    try:
        for _ in range(1100):
            flood.append(socket.create_connection(("127.0.0.1", node_agent.metrics_port),
                                                  timeout=5))
        kubectl("delete", "pod", "-n", namespace, name, "--wait=true", "--timeout=90s")
        gone = time.monotonic()
        while node_agent.caps() and time.monotonic() - gone < 60:
            time.sleep(0.1)
        took = time.monotonic() - gone
    finally:
        for s in flood:
            s.close()
    assert node_agent.proc.poll() is None, node_agent.log.read_text()[-2000:]
    assert node_agent.caps() == {}, node_agent.log.read_text()[-2000:]
    assert node_agent.limit(gpu) == TDP_WATTS
    print(f"cap back {took:.1f} s after the pod's delete returned, under a flood of 1,100 "
          "connections")
    assert took <= TIDY_SECONDS, took
    # The GPU's next tenant starts from the board's own limit, the one it gets back.
    after = agent_pod(namespace)
    kubectl.apply(after)
    then = said(kubectl, namespace, after["metadata"]["name"])
    assert then["range"]["original"] == TDP_WATTS and then["cap"] == {"watts": 150}, then
    kubectl("delete", "pod", "-n", namespace, after["metadata"]["name"], "--wait=false")



def test_a_gpu_time_sliced_between_pods_is_read_by_each_and_capped_by_none(
        node_agent: Any, fake_gpus: Any, kubectl: Kubectl, namespace: str) -> None:
    """One GPU shared three ways, as NVIDIA's plugin time-slices one (device IDs
    `<UUID>::<i>`): two pods given a replica each read the same GPU, and no cap stays on
    it (the second is refused; a cap the first set before the second was listed is put
    back within a tidy interval)."""
    wait_for(lambda: not gpus_by_pod(fake_gpus.pod_resources_socket), POD_TIMEOUT,
             interval=0.5, what="no pod left holding a GPU (the plugin's devices change)")
    fake_gpus.restart_fake_gpus(1, replicas=3)
    pods = [agent_pod(namespace) for _ in range(2)]
    try:
        kubectl.apply(*pods)
        answers = [said(kubectl, namespace, p["metadata"]["name"]) for p in pods]
        assert [a["mine"] for a in answers] == [[fake_uuid(0)]] * 2, answers
        held = gpus_by_pod(fake_gpus.pod_resources_socket)
        assert len(held) == 2 and set(held.values()) == {frozenset({fake_uuid(0)})}, held
        assert any("shared with another pod" in a["cap"].get("error", "") for a in answers)
        wait_for(lambda: node_agent.caps() == {}, 2 * TIDY_SECONDS, interval=0.2,
                 what=f"no cap on the shared GPU: {node_agent.caps()}")
        assert node_agent.limit(fake_uuid(0)) == TDP_WATTS
    finally:
        for p in pods:
            kubectl("delete", "pod", "-n", namespace, p["metadata"]["name"], "--wait=true",
                    "--timeout=90s", check=False)
        fake_gpus.restart_fake_gpus(2)
