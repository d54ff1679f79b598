"""The node agent on one machine: a real Unix socket, real processes placed in cgroups
named as the kubelet names a pod's, the simulated board keyed by its GPUs' UUIDs. What
reliability.md's threat model promises, line by line: a pod reads and caps only its own
GPUs, cannot raise a limit above what it was, keeps no cap after it ends; a caller that
is not a pod is refused; a malformed request leaves the agent serving."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from throttledjob.contracts.policy import Policy
from throttledjob.node.caps import CapKeeper
from throttledjob.node.identity import pod_uid_of_cgroup
from throttledjob.node.server import NodeAgent, serve
from throttledjob.sidecar.gpu.agent import GpuAgent
from throttledjob.sidecar.gpu.backend import GpuError
from throttledjob.sidecar.gpu.fake import MIN_LIMIT_WATTS, TDP_WATTS, FakeGpuBackend
from throttledjob.sidecar.gpu.node_backend import NodeAgentBackend

CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
needs_cgroup_v1 = pytest.mark.skipif(
    not (os.access(CPU_CGROUP, os.W_OK) or os.environ.get("CI")),
    reason="places processes in a cgroup v1 cpu hierarchy (root)")
POD_A, POD_B = str(uuid.uuid4()), str(uuid.uuid4())


@pytest.mark.parametrize("text, pod", [
    (f"4:cpu,cpuacct:/kubepods/burstable/pod{POD_A}/0123abcd\n", POD_A),
    (f"4:cpu,cpuacct:/kubepods/pod{POD_A}/0123abcd\n", POD_A),
    ("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
     f"{POD_A.replace('-', '_')}.slice/cri-containerd-0123.scope\n", POD_A),
    ("4:cpu,cpuacct:/user.slice\n0::/init.scope\n", None),
])
def test_the_pod_is_read_from_the_kubelets_cgroup_names(text, pod):
    assert pod_uid_of_cgroup(text) == pod


@pytest.fixture
def node(tmp_path: Path):
    """An agent over two simulated GPUs: GPU 0 is pod A's, GPU 1 pod B's."""
    board = FakeGpuBackend(2, "steady")
    uuids = [r.uuid for r in board.read()]
    assigned = {POD_A: frozenset({uuids[0]}), POD_B: frozenset({uuids[1]})}
    keeper = CapKeeper(board, tmp_path / "caps.json")
    server = serve(tmp_path / "agent.sock", NodeAgent(board, keeper, lambda: assigned))
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield board, uuids, assigned, keeper, tmp_path / "agent.sock"
    server.shutdown()
    server.server_close()


@pytest.fixture
def pod_cgroups():
    """Make `in_pod(uid)`: a preexec that puts the child in a cgroup named after the pod."""
    made = []

    def in_pod(pod: str):
        group = CPU_CGROUP / "throttledjob-test-node" / f"pod{pod}"
        group.mkdir(parents=True, exist_ok=True)
        made.append(group)
        return lambda: (group / "cgroup.procs").write_text(str(os.getpid()))

    yield in_pod
    for group in made:
        group.rmdir()
    (CPU_CGROUP / "throttledjob-test-node").rmdir()


ASK = """
import json, sys
from pathlib import Path
from throttledjob.sidecar.gpu.node_backend import NodeAgentBackend
from throttledjob.sidecar.gpu.backend import GpuError
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
    board, uuids, *_, sock = node
    got = ask_as(pod_cgroups(POD_A), sock,
                 {"op": "set_power_limit", "uuid": uuids[0], "watts": 150.0},
                 {"op": "set_power_limit", "uuid": uuids[1], "watts": 150.0},
                 {"op": "range", "uuid": uuids[0]})
    assert got["read"] == [uuids[0]]
    capped, foreign, span = got["answers"]
    assert capped == {"watts": 150.0}
    assert "not this pod's" in foreign["error"]
    assert span == {"min": MIN_LIMIT_WATTS, "max": TDP_WATTS}
    assert board.limits == [150.0, TDP_WATTS]    # the other pod's GPU untouched
    assert json.loads((sock.parent / "caps.json").read_text()) == {
        "caps": {uuids[0]: {"original_watts": TDP_WATTS, "pod": POD_A}}}


@needs_cgroup_v1
def test_a_pod_cannot_raise_a_limit_over_what_it_was_and_a_cap_is_clamped(node, pod_cgroups):
    board, uuids, _, keeper, sock = node
    board.limits[0] = 250.0   # the node's own limit, set by its admin
    got = ask_as(pod_cgroups(POD_A), sock,
                 {"op": "set_power_limit", "uuid": uuids[0], "watts": 10.0},
                 {"op": "set_power_limit", "uuid": uuids[0], "watts": 1000.0})
    assert got["answers"] == [{"watts": MIN_LIMIT_WATTS}, {"watts": 250.0}]
    assert board.limits[0] == 250.0 and keeper.caps == {}


def test_a_caller_outside_any_pod_is_refused(node):
    board, uuids, *_, sock = node
    backend = NodeAgentBackend(sock)
    with pytest.raises(GpuError, match="not a pod's process"):
        backend.read()
    with pytest.raises(GpuError, match="not a pod's process"):
        backend._ask({"op": "set_power_limit", "uuid": uuids[0], "watts": 150.0})
    assert board.limit_calls == []


@needs_cgroup_v1
def test_a_gpu_shared_by_two_pods_is_read_by_both_and_capped_by_neither(node, pod_cgroups):
    board, uuids, assigned, _, sock = node
    assigned[POD_B] = frozenset({uuids[0], uuids[1]})   # GPU 0 time-sliced with pod A
    got = ask_as(pod_cgroups(POD_B), sock,
                 {"op": "set_power_limit", "uuid": uuids[0], "watts": 150.0})
    assert got["read"] == uuids
    assert "shared with another pod" in got["answers"][0]["error"]
    assert board.limit_calls == []


def test_caps_of_pods_gone_are_restored_even_by_an_agent_restarted_after_a_kill(tmp_path):
    board = FakeGpuBackend(2, "steady")
    a, b = board.read()
    keeper = CapKeeper(board, tmp_path / "caps.json")
    keeper.set_limit(a, POD_A, 150.0)
    keeper.set_limit(b, POD_B, 180.0)
    # The agent is killed (no restore); a new one reads the state, while pod A is gone.
    restarted = CapKeeper(board, tmp_path / "caps.json")
    restarted.restore_gone({POD_B})
    assert board.limits == [TDP_WATTS, 180.0]
    restarted.restore_all()   # SIGTERM
    assert board.limits == [TDP_WATTS, TDP_WATTS]
    assert CapKeeper(board, tmp_path / "caps.json").caps == {}


def test_malformed_requests_close_the_connection_and_the_agent_serves_on(node, caplog):
    *_, sock = node
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
    with pytest.raises(GpuError, match="not a pod's process"):
        NodeAgentBackend(sock).read()
    assert any("closing a connection" in r.message for r in caplog.records)


def test_a_sidecar_with_no_agent_answering_runs_cpu_only_and_says_why(tmp_path):
    agent = GpuAgent(NodeAgentBackend(tmp_path / "nobody.sock"), Policy(gpu_peak_power_watts=200))
    for _ in range(3):
        assert agent.cycle(1.0, 0.0, []) is None
    assert agent.error_lost and "node agent not reachable" in agent.error
