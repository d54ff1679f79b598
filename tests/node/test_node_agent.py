"""The node agent on one machine: real Unix sockets (one per pod, as its CSI volume gets
one), real processes placed in cgroups named as the kubelet names a pod's, the simulated
board keyed by its GPUs' UUIDs. What reliability.md's threat model promises, line by
line: a pod reads and caps only its own GPUs, cannot raise a limit above what it was,
keeps no cap after it ends; a process of another pod on a pod's socket is refused; a
malformed request leaves the agent serving."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from throttledjob.contracts.policy import Policy
from throttledjob.gpu.backend import GpuError
from throttledjob.gpu.fake import MIN_LIMIT_WATTS, TDP_WATTS, FakeGpuBackend
from throttledjob.gpu.node_backend import NodeAgentBackend
from throttledjob.node.caps import CapKeeper
from throttledjob.node.identity import PodRef, pod_uid_of_cgroup
from throttledjob.node.socket_protocol import MAX_CONNECTIONS, NodeAgent, serve
from throttledjob.sidecar.gpu_agent import LOST_RETRY_SECONDS, GpuAgent

CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
needs_cgroup_v1 = pytest.mark.skipif(
    not (os.access(CPU_CGROUP, os.W_OK) or os.environ.get("CI")),
    reason="places processes in a cgroup v1 cpu hierarchy (root)")
POD_A = PodRef("team", "train-a", str(uuid.uuid4()), power_cap=True)
POD_B = PodRef("team", "train-b", str(uuid.uuid4()), power_cap=True)


@pytest.mark.parametrize("text, pod", [
    (f"4:cpu,cpuacct:/kubepods/burstable/pod{POD_A.uid}/0123abcd\n", POD_A.uid),
    (f"4:cpu,cpuacct:/kubepods/pod{POD_A.uid}/0123abcd\n", POD_A.uid),
    ("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
     f"{POD_A.uid.replace('-', '_')}.slice/cri-containerd-0123.scope\n", POD_A.uid),
    ("4:cpu,cpuacct:/user.slice\n0::/init.scope\n", None),
])
def test_the_pod_is_read_from_the_kubelets_cgroup_names(text, pod):
    assert pod_uid_of_cgroup(text) == pod


@pytest.fixture
def node(tmp_path: Path):
    """An agent over two simulated GPUs: GPU 0 is pod A's, GPU 1 pod B's; each pod's
    socket in a directory of its own. Yields the board, the UUIDs, the assignments, the
    keeper and the sockets by pod."""
    board = FakeGpuBackend(2, "steady")
    uuids = [r.uuid for r in board.read()]
    assigned = {POD_A.key: frozenset({uuids[0]}), POD_B.key: frozenset({uuids[1]})}
    keeper = CapKeeper(board, tmp_path / "caps.json")
    agent = NodeAgent(board, keeper, lambda: assigned)
    servers, sockets = [], {}
    for pod in (POD_A, POD_B):
        (tmp_path / pod.name).mkdir()
        sockets[pod] = tmp_path / pod.name / "agent.sock"
        servers.append(serve(sockets[pod], agent, pod, anonymous=True))
        threading.Thread(target=servers[-1].serve_forever, args=(0.05,), daemon=True).start()
    yield board, uuids, assigned, keeper, sockets
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def pod_cgroups():
    """Make `in_pod(uid)`: a preexec that puts the child in a cgroup named after the pod."""
    made = []

    def in_pod(pod: PodRef):
        group = CPU_CGROUP / "throttledjob-test-node" / f"pod{pod.uid}"
        group.mkdir(parents=True, exist_ok=True)
        made.append(group)
        return lambda: (group / "cgroup.procs").write_text(str(os.getpid()))

    yield in_pod
    for group in made:
        group.rmdir()
    (CPU_CGROUP / "throttledjob-test-node").rmdir()


ASK = """
import json, sys
from dataclasses import replace
from pathlib import Path
from throttledjob.gpu.node_backend import NodeAgentBackend
from throttledjob.gpu.backend import GpuError
b = NodeAgentBackend(Path(sys.argv[1]))
out = {"read": [r.uuid for r in b.read()]}
for raw in sys.argv[2:]:
    req = json.loads(raw)
    try:
        out.setdefault("answers", []).append(b._ask(req))
    except GpuError as e:
        out.setdefault("answers", []).append({"error": str(e)})
print(json.dumps(out))
"""


def ask_as(preexec, sock: Path, *requests: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", ASK, str(sock), *map(json.dumps, requests)],
                          preexec_fn=preexec, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@needs_cgroup_v1
def test_a_pod_reads_and_caps_its_own_gpu_and_no_other(node, pod_cgroups):
    board, uuids, *_, sockets = node
    got = ask_as(pod_cgroups(POD_A), sockets[POD_A],
                 {"op": "set_power_limit", "uuid": uuids[0], "watts": 150.0},
                 {"op": "set_power_limit", "uuid": uuids[1], "watts": 150.0},
                 {"op": "range", "uuid": uuids[0]})
    assert got["read"] == [uuids[0]]
    capped, foreign, span = got["answers"]
    assert capped == {"watts": 150.0}
    assert "not this pod's" in foreign["error"]
    assert span == {"min": MIN_LIMIT_WATTS, "max": TDP_WATTS, "original": TDP_WATTS}
    assert board.limits == [150.0, TDP_WATTS]    # the other pod's GPU untouched
    assert json.loads((sockets[POD_A].parent.parent / "caps.json").read_text())["caps"] == {
        uuids[0]: {"original_watts": TDP_WATTS, "pod": POD_A.key, "set_watts": 150.0,
                   "was_watts": None, "pod_uid": POD_A.uid}}


@needs_cgroup_v1
def test_a_pod_cannot_raise_a_limit_over_what_it_was_and_a_cap_is_clamped(node, pod_cgroups):
    board, uuids, _, keeper, sockets = node
    board.limits[0] = 250.0   # the node's own limit, set by its admin
    got = ask_as(pod_cgroups(POD_A), sockets[POD_A],
                 {"op": "set_power_limit", "uuid": uuids[0], "watts": 10.0},
                 {"op": "set_power_limit", "uuid": uuids[0], "watts": 1000.0})
    assert got["answers"] == [{"watts": MIN_LIMIT_WATTS}, {"watts": 250.0}]
    assert board.limits[0] == 250.0 and keeper.caps == {}


@needs_cgroup_v1
def test_a_process_of_another_pod_on_a_pods_socket_is_refused(node, pod_cgroups, caplog):
    """A socket passed on, or reached some other way: the caller's cgroup says it is pod
    B's, so pod A's socket answers it nothing and changes nothing."""
    board, *_, sockets = node
    done = subprocess.run([sys.executable, "-c", ASK, str(sockets[POD_A])],
                          preexec_fn=pod_cgroups(POD_B), capture_output=True, text=True,
                          timeout=30)
    assert done.returncode != 0 and "another pod's" in done.stderr, done.stderr
    assert board.limit_calls == []
    assert any("refused pod" in r.message for r in caplog.records)


@needs_cgroup_v1
def test_a_gpu_shared_by_two_pods_is_read_by_both_and_capped_by_neither(node, pod_cgroups):
    board, uuids, assigned, _, sockets = node
    assigned[POD_B.key] = frozenset({uuids[0], uuids[1]})   # GPU 0 time-sliced with pod A
    got = ask_as(pod_cgroups(POD_B), sockets[POD_B],
                 {"op": "set_power_limit", "uuid": uuids[0], "watts": 150.0})
    assert got["read"] == uuids
    assert "shared with another pod" in got["answers"][0]["error"]
    assert board.limit_calls == []


def test_a_pod_the_kubelet_lists_no_gpu_for_is_told_so(node):
    """A pod with the agent's volume but no GPU allocated (or one the kubelet has not
    listed): its sidecar's reads fail with why, and after three it runs CPU-only, saying
    it in /status."""
    board, _, assigned, _, sockets = node
    del assigned[POD_A.key]
    agent = GpuAgent(NodeAgentBackend(sockets[POD_A]), Policy(gpu_peak_power_watts=200))
    for _ in range(3):
        agent.cycle(1.0, 0.0, [])
    assert agent.error_lost
    assert f"the kubelet lists no GPU of pod {POD_A.key}" in agent.error
    assert board.limit_calls == []


def test_caps_of_pods_gone_are_restored_even_by_an_agent_restarted_after_a_kill(tmp_path):
    board = FakeGpuBackend(2, "steady")
    a, b = board.read()
    keeper = CapKeeper(board, tmp_path / "caps.json")
    keeper.set_limit(a, POD_A, 150.0)
    keeper.set_limit(b, POD_B, 180.0)
    # The agent is killed (no restore); a new one reads the state, while pod A is gone.
    restarted = CapKeeper(board, tmp_path / "caps.json")
    restarted.restore_gone({POD_B.key: frozenset({b.uuid})})
    assert board.limits == [TDP_WATTS, 180.0]
    restarted.restore_all()   # SIGTERM
    assert board.limits == [TDP_WATTS, TDP_WATTS]
    assert CapKeeper(board, tmp_path / "caps.json").caps == {}


def test_malformed_requests_close_the_connection_and_the_agent_serves_on(node, caplog):
    *_, sockets = node
    sock = sockets[POD_A]
    rng = random.Random(7)
    for size in [*(rng.randrange(1, 300) for _ in range(30)), 10_000]:
        noise = bytes(rng.randrange(256) for _ in range(size)) + b"\n"
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(sock))
            try:
                s.sendall(noise)
                s.shutdown(socket.SHUT_WR)
                answer = s.makefile("rb").read()
            except ConnectionResetError:   # closed with the rest of a long line unread
                answer = b""
        # Either refused as not JSON (closed, no answer) or, where the noise happened to
        # be JSON, answered with a refusal: never anything else.
        assert answer == b"" or b'"error"' in answer
    assert [r.index for r in NodeAgentBackend(sock).read()] == [0]   # still serving
    assert any("closing a connection" in r.message for r in caplog.records)


def test_a_pod_holding_sockets_open_gets_a_few_and_each_for_a_while(tmp_path):
    """A workload that opens connections and says nothing: its pod gets MAX_CONNECTIONS
    at once, each closed after the idle time; the agent serves it again after that."""
    board = FakeGpuBackend(1, "steady")
    agent = NodeAgent(board, CapKeeper(board, tmp_path / "caps.json"),
                      lambda: {POD_A.key: frozenset({board.read()[0].uuid})})
    server = serve(tmp_path / "agent.sock", agent, POD_A, idle_seconds=1.0, anonymous=True)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        held = []
        for _ in range(MAX_CONNECTIONS):
            held.append(socket.socket(socket.AF_UNIX))
            held[-1].connect(str(tmp_path / "agent.sock"))
        time.sleep(0.2)
        with pytest.raises(GpuError, match="too many connections"):
            NodeAgentBackend(tmp_path / "agent.sock").read()
        time.sleep(1.5)   # past the idle time: the silent ones were closed
        assert all(s.recv(1) == b"" for s in held)
        assert [r.index for r in NodeAgentBackend(tmp_path / "agent.sock").read()] == [0]
    finally:
        server.shutdown()
        server.server_close()


def test_a_sidecar_with_no_agent_answering_runs_cpu_only_and_says_why(tmp_path):
    agent = GpuAgent(NodeAgentBackend(tmp_path / "nobody.sock"), Policy(gpu_peak_power_watts=200))
    for _ in range(3):
        assert agent.cycle(1.0, 0.0, []) is None
    assert agent.error_lost and "node agent not reachable" in agent.error


def test_a_sidecar_reads_and_caps_again_once_a_restarted_agent_answers(tmp_path):
    """The agent stops (a DaemonSet roll: it puts the cap back at SIGTERM) and is gone
    for longer than three reads: the sidecar runs CPU-only, holding nothing back, and
    asks each cycle; the restarted agent answers, and the sidecar reads and caps again."""
    board = FakeGpuBackend(1, "steady")
    keeper = CapKeeper(board, tmp_path / "caps.json")
    agent = NodeAgent(board, keeper, lambda: {POD_A.key: frozenset({board.read()[0].uuid})})
    sock = tmp_path / "agent.sock"

    def start():
        server = serve(sock, agent, POD_A, anonymous=True)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        return server

    server = start()
    sidecar = GpuAgent(NodeAgentBackend(sock), Policy(gpu_peak_power_watts=200,
                                                     gpu_power_limit="allow"))
    sidecar.cycle(1.0, 0.0, [])
    assert board.limits == [194.0]
    server.close()                           # the old agent at its SIGTERM: no pod
    keeper.restore_all()                     # served, then every cap put back
    duties = [sidecar.cycle(1.0, 0.0, []) for _ in range(5)]
    assert duties[-1] is None                # lost: nothing held back for the GPU
    assert sidecar.error_lost and sidecar.readings == []
    assert not sidecar.state().capping       # the agent put the cap back
    server = start()
    try:
        cycles = 0
        while sidecar.error_lost and cycles < LOST_RETRY_SECONDS:   # asked every 5 s
            sidecar.cycle(1.0, 0.0, [])
            cycles += 1
        assert not sidecar.error_lost and sidecar.error is None
        assert [r.index for r in sidecar.readings] == [0]
        assert board.limits == [194.0]           # capped again
    finally:
        server.close()


@pytest.mark.parametrize("then", ["deny", "no power target"])
def test_a_sidecar_restarted_mid_cap_still_puts_the_gpus_own_limit_back(tmp_path, then):
    """The sidecar's container restarts while its GPU is capped: the new one reads the
    capped limit, and once wrote it back as the GPU's own, for good. The agent keeps the
    original; the sidecar asks it to put the GPU back."""
    board = FakeGpuBackend(1, "steady")
    keeper = CapKeeper(board, tmp_path / "caps.json")
    agent = NodeAgent(board, keeper, lambda: {POD_A.key: frozenset({board.read()[0].uuid})})
    server = serve(tmp_path / "agent.sock", agent, POD_A, anonymous=True)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    capping = Policy(gpu_peak_power_watts=200, gpu_power_limit="allow")
    try:
        first = GpuAgent(NodeAgentBackend(tmp_path / "agent.sock"), capping)
        first.cycle(1.0, 0.0, [])
        assert board.limits == [194.0]
        first.backend.close()   # killed: nothing put back
        restarted = GpuAgent(NodeAgentBackend(tmp_path / "agent.sock"), capping)
        restarted.cycle(1.0, 0.0, [])
        assert board.limits == [194.0] and restarted.state().capping
        if then == "deny":   # the policy edited
            restarted.set_policy(Policy(gpu_peak_power_watts=200))
        else:                # a utilization target alone: nothing to cap
            restarted.set_policy(Policy(gpu_peak_utilization_percent=70,
                                        gpu_power_limit="allow"))
            restarted.cycle(1.0, 0.0, [])
        assert board.limits == [TDP_WATTS] and keeper.caps == {}
        restarted.close()
    finally:
        server.close()


class SlowBoard(FakeGpuBackend):
    """A board whose power-limit call takes a while, as NVML's does: the window in which
    a restore from another thread could fall between a cap's record and its write."""

    def set_power_limit_watts(self, index: int, watts: float) -> None:
        time.sleep(0.01)
        super().set_power_limit_watts(index, watts)


def test_caps_and_restores_from_many_threads_never_lose_the_original(tmp_path):
    board = SlowBoard(1, "steady")
    keeper = CapKeeper(board, tmp_path / "caps.json")
    gpu_uuid = board.read()[0].uuid

    def cap() -> None:
        for _ in range(30):
            keeper.set_limit(board.read()[0], POD_A, 150.0)

    def restore() -> None:
        for _ in range(30):
            keeper.restore(gpu_uuid)
            time.sleep(0.005)

    threads = [threading.Thread(target=f) for f in (cap, restore, cap, restore)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Capped now or not, the record holds the board's own limit, and putting it back
    # gives the board its own limit again.
    assert all(c.original_watts == TDP_WATTS for c in keeper.caps.values())
    assert (board.limits == [TDP_WATTS]) == (keeper.caps == {})
    keeper.restore_all()
    assert board.limits == [TDP_WATTS] and CapKeeper(board, tmp_path / "caps.json").caps == {}


def test_connections_over_the_limit_are_refused_without_a_thread_each(tmp_path):
    board = FakeGpuBackend(1, "steady")
    agent = NodeAgent(board, CapKeeper(board, tmp_path / "caps.json"),
                      lambda: {POD_A.key: frozenset({board.read()[0].uuid})})
    server = serve(tmp_path / "agent.sock", agent, POD_A, anonymous=True)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    before = threading.active_count()
    held = []
    try:
        for _ in range(40):
            held.append(socket.socket(socket.AF_UNIX))
            held[-1].connect(str(tmp_path / "agent.sock"))
        time.sleep(0.5)
        assert threading.active_count() - before <= MAX_CONNECTIONS
        held[-1].settimeout(5)
        assert b"too many connections" in held[-1].recv(200)
    finally:
        for s in held:
            s.close()
        server.close()


def test_a_process_of_no_pod_is_refused(tmp_path, caplog):
    """A caller whose pod cannot be told (its cgroup names none, or it exited and left
    its socket to a child) is not served: the check fails closed."""
    board = FakeGpuBackend(1, "steady")
    agent = NodeAgent(board, CapKeeper(board, tmp_path / "caps.json"),
                      lambda: {POD_A.key: frozenset({board.read()[0].uuid})})
    server = serve(tmp_path / "agent.sock", agent, POD_A)   # this test's process: no pod
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        with pytest.raises(GpuError, match="the caller's pod could not be told"):
            NodeAgentBackend(tmp_path / "agent.sock").read()
        assert any("a process of no pod" in r.message for r in caplog.records)
    finally:
        server.close()


def test_a_cap_set_while_a_gpu_was_one_pods_is_put_back_once_it_is_shared(tmp_path):
    from throttledjob.node.process import Node

    board = FakeGpuBackend(1, "steady")
    gpu = board.read()[0]
    assigned = {POD_A.key: frozenset({gpu.uuid})}
    node = Node(board, tmp_path, tmp_path / "state", list_gpus=lambda: assigned)
    (tmp_path / "mount").mkdir()
    node.publish(tmp_path / "mount", POD_A)
    node.keeper.set_limit(gpu, POD_A, 150.0)
    node.tidy()
    assert board.limits == [150.0]
    assigned[POD_B.key] = frozenset({gpu.uuid})   # time-sliced: pod B gets a replica
    node.tidy()
    assert board.limits == [TDP_WATTS] and node.keeper.caps == {}


@pytest.mark.parametrize("watts", [float("nan"), float("inf"), 10**400, "150", True, -5])
def test_a_limit_that_is_not_a_finite_positive_number_is_refused(node, watts):
    board, uuids, _, keeper, _ = node
    answer = NodeAgent(board, keeper, lambda: {POD_A.key: frozenset({uuids[0]})}).answer(
        POD_A, {"op": "set_power_limit", "uuid": uuids[0], "watts": watts})
    assert answer == {"error": "watts must be a positive number"}
    assert board.limit_calls == []


def test_a_pod_whose_throttledjob_does_not_allow_the_cap_reads_but_never_caps(node, caplog):
    """The volume's attribute, not the sidecar's word: a pod made without it (its policy
    denies levers.gpuPowerLimit, or a pod the operator did not make) reads its GPU and
    may put its limit back, never lower it."""
    board, uuids, _, keeper, _ = node
    agent = NodeAgent(board, keeper, lambda: {POD_A.key: frozenset({uuids[0]})})
    denied = replace(POD_A, power_cap=False)
    assert agent.answer(denied, {"op": "read"})["gpus"][0]["uuid"] == uuids[0]
    answer = agent.answer(denied, {"op": "set_power_limit", "uuid": uuids[0], "watts": 150})
    assert "may not cap its GPU" in answer["error"] and "gpuPowerLimit" in answer["error"]
    for _ in range(20):   # asked in a loop: said in the agent's log once
        agent.answer(denied, {"op": "set_power_limit", "uuid": uuids[0], "watts": 150})
    said = [r.message for r in caplog.records if "refused a cap of pod" in r.message]
    assert len(said) == 1 and denied.key in said[0] and "gpuPowerLimit" in said[0], said
    assert agent.answer(denied, {"op": "restore", "uuid": uuids[0]}) == {"watts": TDP_WATTS}
    assert board.limit_calls == [] and board.limits == [TDP_WATTS, TDP_WATTS]


@pytest.mark.parametrize(("attributes", "power_cap"), [
    ({"powerCap": "true"}, True), ({"powerCap": "false"}, False), ({}, False),
    ({"powerCap": "True"}, False)])
def test_the_kubelets_publish_names_the_pod_and_whether_it_may_cap(tmp_path, attributes,
                                                                    power_cap):
    """NodePublishVolume as the kubelet sends it (podInfoOnMount, the volume's
    attributes): the pod it publishes for carries the operator's word on the cap."""
    from throttledjob.node.csi import EPHEMERAL, POD_INFO, _Plugin
    from throttledjob.node.kubelet import csi_pb2

    published = []
    plugin = _Plugin("node-0", tmp_path / "csi.sock", lambda d, pod: published.append(pod),
                     lambda d: None)
    info = {POD_INFO + "namespace": POD_A.namespace, POD_INFO + "name": POD_A.name,
            POD_INFO + "uid": POD_A.uid, EPHEMERAL: "true", **attributes}
    plugin.NodePublishVolume(csi_pb2.NodePublishVolumeRequest(
        volume_id="v", readonly=True, target_path=str(tmp_path / "mount"),
        volume_context=info), None)
    assert published == [replace(POD_A, power_cap=power_cap)]


@pytest.mark.parametrize(("ephemeral", "readonly", "why"), [
    ("false", True, "PersistentVolume"), (None, True, "PersistentVolume"),
    ("true", False, "read-only")])
def test_a_volume_the_agent_does_not_serve_is_refused_and_said(tmp_path, caplog, ephemeral,
                                                               readonly, why):
    """A PersistentVolume naming the driver (its attributes are its author's; the kubelet
    says "false"), should the CSIDriver allow the Persistent mode; a volume mounted
    writable (the pod could fill the node's disk from it, or put a link where the socket
    goes): refused, whatever its attributes say, in the kubelet's error and the log."""
    from throttledjob.node.csi import EPHEMERAL, POD_INFO, _Plugin
    from throttledjob.node.kubelet import csi_pb2

    class Aborted(Exception):
        pass

    class Context:
        def abort(self, code, details):
            raise Aborted(code, details)

    published = []
    plugin = _Plugin("node-0", tmp_path / "csi.sock", lambda d, pod: published.append(pod),
                     lambda d: None)
    info = {POD_INFO + "namespace": POD_A.namespace, POD_INFO + "name": POD_A.name,
            POD_INFO + "uid": POD_A.uid, "powerCap": "true",
            **({EPHEMERAL: ephemeral} if ephemeral else {})}
    with pytest.raises(Aborted, match=why):
        plugin.NodePublishVolume(csi_pb2.NodePublishVolumeRequest(
            volume_id="v", readonly=readonly, target_path=str(tmp_path / "mount"),
            volume_context=info), Context())
    assert published == []
    assert any("refused" in r.message and why in r.message and POD_A.key in r.message
               for r in caplog.records)


def test_a_state_file_that_cannot_be_read_is_set_aside_not_a_crash_at_every_start(tmp_path,
                                                                                   caplog):
    (tmp_path / "caps.json").write_text("")   # a crash before the rename reached the disk
    keeper = CapKeeper(FakeGpuBackend(1, "steady"), tmp_path / "caps.json")
    assert keeper.caps == {}
    assert (tmp_path / "caps.bad").read_text() == "" and not (tmp_path / "caps.json").exists()
    assert any("unreadable" in r.message for r in caplog.records)


def test_a_second_volume_of_the_driver_in_one_pod_is_refused_so_the_pod_never_starts(
        tmp_path):
    """A pod template may carry a volume of the driver besides the operator's (written in a
    ThrottledJob: the operator, which may use the volume, makes the Job as written), one
    saying powerCap "true" where the operator's says "false". The agent serves one volume
    a pod: the other's publish is refused (the kubelet starts none of a pod's containers
    until every volume is set up), whichever comes first; publishing the same one again is
    not refused."""
    import grpc

    from throttledjob.node.csi import EPHEMERAL, POD_INFO, _Plugin
    from throttledjob.node.kubelet import csi_pb2
    from throttledjob.node.process import Node

    node = Node(FakeGpuBackend(1, "steady"), tmp_path / "kubelet", tmp_path / "state",
                list_gpus=dict)
    plugin = _Plugin("node-0", tmp_path / "csi.sock", node.publish, node.unpublish)

    class Aborted(Exception):
        pass

    class Context:
        def abort(self, code, details):
            raise Aborted(code, details)

    def publish(volume: str, power_cap: str) -> None:
        info = {POD_INFO + "namespace": POD_A.namespace, POD_INFO + "name": POD_A.name,
                POD_INFO + "uid": POD_A.uid, EPHEMERAL: "true",
                "powerCap": power_cap}
        plugin.NodePublishVolume(csi_pb2.NodePublishVolumeRequest(
            volume_id=volume, readonly=True, target_path=str(tmp_path / volume / "mount"),
            volume_context=info), Context())

    try:
        publish("operators", "false")
        publish("operators", "false")   # the kubelet again: idempotent
        with pytest.raises(Aborted) as refused:
            publish("users", "true")
        assert refused.value.args[0] == grpc.StatusCode.FAILED_PRECONDITION
        assert [p for _, p in node.listeners.values()] == [replace(POD_A, power_cap=False)]
        node.unpublish(tmp_path / "operators" / "mount")
        publish("users", "true")   # the pod gone (UIDs are not reused): nothing holds it
    finally:
        node.stop()
