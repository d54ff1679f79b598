"""The node agent under attack, on one machine: what a pod (or the node) can do to it,
and that no cap outlives its pod for any of it (docs/reliability.md, "The node agent's
restores"). Each test failed on the agent before these were closed: the restore waited
on a file descriptor, a thread, a server's close; the metrics port made a thread per
connection; a server that never served blocked its close for ever."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import grpc
import pytest

from throttledjob.gpu.backend import GpuError
from throttledjob.gpu.fake import TDP_WATTS, FakeGpuBackend, fake_uuid
from throttledjob.gpu.node_backend import NodeAgentBackend
from throttledjob.node import socket_protocol
from throttledjob.node.caps import CHANGE_BURST, CHANGES_PER_SECOND, CapKeeper
from throttledjob.node.csi import serve_csi
from throttledjob.node.identity import PodRef
from throttledjob.node.metrics import serve_metrics
from throttledjob.node.probe import probe
from throttledjob.node.process import STALE_SECONDS, Node
from throttledjob.node.socket_protocol import NodeAgent, serve
from throttledjob.serving import MAX_CONNECTIONS as METRICS_CONNECTIONS

POD_A = PodRef("team", "train-a", str(uuid.uuid4()), power_cap=True)
POD_B = PodRef("team", "train-b", str(uuid.uuid4()), power_cap=True)


def kubelet_down():
    class Down(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAVAILABLE

    raise Down()


def capped_node(tmp_path: Path, list_gpus=None) -> tuple[FakeGpuBackend, Node, Path]:
    """A node agent serving pod A's volume, with pod A's GPU capped at 150 W."""
    board = FakeGpuBackend(1, "steady")
    node = Node(board, tmp_path / "kubelet", tmp_path / "state",
                list_gpus=list_gpus or (lambda: {POD_A.key: frozenset({fake_uuid(0)})}))
    volume = tmp_path / "pods" / POD_A.uid / "mount"
    volume.mkdir(parents=True)
    node.publish(volume, POD_A)
    node.keeper.set_limit(board.read()[0], POD_A, 150.0)
    assert board.limits == [150.0]
    return board, node, volume


# In a process of its own: the open-file limit lowered, then every descriptor taken (as
# ~1,000 idle connections to a port took them), then the kubelet's unpublish.
NO_DESCRIPTOR_LEFT = """
import json, resource, sys, uuid
from pathlib import Path
from throttledjob.node.identity import PodRef
from throttledjob.node.process import Node
from throttledjob.gpu.fake import FakeGpuBackend, fake_uuid
tmp = Path(sys.argv[1])
pod = PodRef("team", "train-a", str(uuid.uuid4()), power_cap=True)
board = FakeGpuBackend(1, "steady")
node = Node(board, tmp / "kubelet", tmp / "state",
            list_gpus=lambda: {pod.key: frozenset({fake_uuid(0)})})
volume = tmp / "mount"
volume.mkdir()
node.publish(volume, pod)
node.keeper.set_limit(board.read()[0], pod, 150.0)
resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
held = []
try:
    while True:
        held.append(open("/dev/null"))
except OSError as e:
    taken = e.errno
failed = None
try:
    node.unpublish(volume)
except OSError as e:
    failed = str(e)
limits = list(board.limits)
for f in held:
    f.close()
node.tidy()   # descriptors back: the state file is written again
caps = json.loads((tmp / "state" / "caps.json").read_text())["caps"]
print(json.dumps({"errno": taken, "failed": failed, "limits": limits, "caps": caps,
                  "served": node.served() != []}))
"""


def test_unpublish_puts_the_cap_back_with_no_file_descriptor_left(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", NO_DESCRIPTOR_LEFT, str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["errno"] == 24   # EMFILE: every descriptor taken
    assert out["failed"] is None, out
    assert out["limits"] == [TDP_WATTS], out   # the board first, with no descriptor
    assert out["caps"] == {} and not out["served"], out
    assert "cannot write" in done.stderr   # said, and written at the next pass


def test_caps_of_pods_not_served_are_put_back_with_the_kubelet_down(tmp_path: Path) -> None:
    """The tidying pass needs no kubelet for a pod whose volume is not served (its
    unpublish lost): the agent's own state says so."""
    board, node, volume = capped_node(tmp_path, list_gpus=kubelet_down)
    node.tidy()
    assert board.limits == [150.0]   # served: the kubelet's silence takes nothing off
    server, _ = node.listeners.pop(volume)   # gone without an unpublish
    server.close()
    node.tidy()
    assert board.limits == [TDP_WATTS] and node.keeper.caps == {}


def test_a_restarted_agent_puts_back_the_caps_of_volumes_gone_from_its_state_alone(
        tmp_path: Path) -> None:
    """SIGKILLed while pod A was capped; pod A ended while no agent ran (its volume's
    directory removed); the kubelet does not answer at the restart. The state files are
    enough: the cap is put back at start."""
    board, node, volume = capped_node(tmp_path)
    # Killed: nothing of the agent's runs again; its files stay. The pod's directory goes.
    shutil.rmtree(volume)
    restarted = Node(board, tmp_path / "kubelet", tmp_path / "state", list_gpus=kubelet_down)
    assert fake_uuid(0) in restarted.keeper.caps
    restarted.resume()
    restarted.tidy()
    assert board.limits == [TDP_WATTS] and restarted.keeper.caps == {}
    for server, _ in node.listeners.values():
        server.close()


def test_stop_puts_every_cap_back_before_any_server_is_closed(tmp_path: Path) -> None:
    """A server whose close never returns (as one registered before its thread served
    did): SIGTERM's stop puts the caps back first."""
    board, node, volume = capped_node(tmp_path)

    class Stuck:
        def close(self) -> None:
            threading.Event().wait()

    real, pod = node.listeners[volume]
    node.listeners[volume] = (Stuck(), pod)
    threading.Thread(target=node.stop, daemon=True).start()
    deadline = time.monotonic() + 5
    while board.limits != [TDP_WATTS] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert board.limits == [TDP_WATTS]
    real.close()


def test_a_server_that_never_served_closes_at_once(tmp_path: Path) -> None:
    board = FakeGpuBackend(1, "steady")
    agent = NodeAgent(board, CapKeeper(board, tmp_path / "caps.json"), lambda: {})
    server = serve(tmp_path / "agent.sock", agent, POD_A, anonymous=True)
    closing = threading.Thread(target=server.close, daemon=True)
    closing.start()
    closing.join(5)
    assert not closing.is_alive(), "close() waited for a loop that never ran"
    server.serve_forever(0.05)   # its thread, late: returns at once, serves nothing


def test_a_publish_whose_thread_cannot_start_leaves_nothing_listed_or_open(
        tmp_path: Path, monkeypatch) -> None:
    board = FakeGpuBackend(1, "steady")
    node = Node(board, tmp_path / "kubelet", tmp_path / "state", list_gpus=lambda: {})
    volume = tmp_path / "mount"
    volume.mkdir()
    start = threading.Thread.start

    def no_thread(self) -> None:
        if getattr(self._target, "__name__", "") == "serve_forever":
            raise RuntimeError("can't start new thread")
        start(self)

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    with pytest.raises(RuntimeError):
        node.publish(volume, POD_A)
    assert node.listeners == {} and node.served() == []
    monkeypatch.setattr(threading.Thread, "start", start)
    closing = threading.Thread(target=node.stop, daemon=True)
    closing.start()
    closing.join(5)
    assert not closing.is_alive()
    node.publish(volume, POD_A)   # the kubelet's retry: served
    assert [p for _, p in node.listeners.values()] == [POD_A]
    node.stop()


def test_a_connection_whose_thread_cannot_start_gives_its_slot_back(
        tmp_path: Path, monkeypatch) -> None:
    """A pids limit reached (or the memory gone): each refused connection's slot is given
    back, so the pod is served again once threads can be had."""
    board = FakeGpuBackend(1, "steady")
    agent = NodeAgent(board, CapKeeper(board, tmp_path / "caps.json"),
                      lambda: {POD_A.key: frozenset({fake_uuid(0)})})
    sock = tmp_path / "agent.sock"
    server = serve(sock, agent, POD_A, anonymous=True)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    start = threading.Thread.start
    refused = threading.Event()

    def no_thread(self) -> None:
        if getattr(self._target, "__name__", "") == "process_request_thread":
            refused.set()
            raise RuntimeError("can't start new thread")
        start(self)

    try:
        monkeypatch.setattr(threading.Thread, "start", no_thread)
        for _ in range(2 * socket_protocol.MAX_CONNECTIONS):
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(sock))
                s.settimeout(5)
                assert s.recv(100) == b""   # closed, no answer
        assert refused.is_set()
        monkeypatch.setattr(threading.Thread, "start", start)
        assert [r.index for r in NodeAgentBackend(sock).read()] == [0]
    finally:
        monkeypatch.setattr(threading.Thread, "start", start)
        server.close()


def test_the_metrics_port_flooded_costs_a_few_threads_and_no_restore(tmp_path: Path) -> None:
    """A pod holds 600 idle connections to the agent's /metrics: the agent runs at most
    the server's bound of threads for them, the capped pod's unpublish puts its cap back
    meanwhile, and a scraper from another address is served."""
    board, node, volume = capped_node(tmp_path)
    metrics = serve_metrics(node, 0, host="127.0.0.1")
    port = metrics.server_address[1]
    before = threading.active_count()
    held = []
    try:
        for _ in range(600):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            held.append(s)
        time.sleep(0.5)
        assert threading.active_count() - before <= METRICS_CONNECTIONS
        started = time.monotonic()
        node.unpublish(volume)
        assert board.limits == [TDP_WATTS]
        assert time.monotonic() - started < 1.0
        scrape = socket.create_connection(("127.0.0.1", port), timeout=5,
                                          source_address=("127.0.0.2", 0))
        with scrape:
            scrape.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            body = b"".join(iter(lambda: scrape.recv(65536), b""))
        assert b"throttledjob_node_gpu_power_limit_watts" in body
    finally:
        for s in held:
            s.close()
        metrics.shutdown()
        metrics.server_close()
        node.stop()


def test_the_metrics_name_no_pod_unless_asked(tmp_path: Path) -> None:
    _, node, _ = capped_node(tmp_path)
    try:
        for pod_names in (False, True):
            metrics = serve_metrics(node, 0, pod_names, host="127.0.0.1")
            url = f"http://127.0.0.1:{metrics.server_address[1]}/metrics"
            with urllib.request.urlopen(url, timeout=5) as r:
                text = r.read().decode()
            metrics.shutdown()
            metrics.server_close()
            assert (POD_A.name in text) is pod_names, text
            assert (POD_A.namespace in text) is pod_names
            assert f'throttledjob_node_gpu_original_power_limit_watts{{UUID="{fake_uuid(0)}"' \
                in text
    finally:
        node.stop()


def test_the_socket_is_made_over_whatever_the_pod_left_and_never_through_a_link(
        tmp_path: Path) -> None:
    """The pod's directory as a pod with write access once left it: a directory at the
    socket's name, a symlink to a file of the node's. The socket replaces both, and the
    file the link named keeps its mode."""
    board = FakeGpuBackend(1, "steady")
    agent = NodeAgent(board, CapKeeper(board, tmp_path / "caps.json"),
                      lambda: {POD_A.key: frozenset({fake_uuid(0)})})
    node_file = tmp_path / "shadow"
    node_file.write_text("root's")
    node_file.chmod(0o600)
    sock = tmp_path / "mount" / "agent.sock"
    sock.mkdir(parents=True)
    (sock / "filler").write_bytes(b"x" * 1024)
    for planted in ("directory", "symlink"):
        if planted == "symlink":
            sock.symlink_to(node_file)
        server = serve(sock, agent, POD_A, anonymous=True)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        assert sock.is_socket() and not sock.is_symlink()
        assert [r.index for r in NodeAgentBackend(sock).read()] == [0]
        server.close()
        sock.unlink()
    assert oct(node_file.stat().st_mode & 0o777) == oct(0o600)
    with pytest.raises(OSError, match="not the agent's socket"):
        directory = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
        try:
            socket_protocol._make_connectable(directory, "shadow")
        finally:
            os.close(directory)
    assert oct(node_file.stat().st_mode & 0o777) == oct(0o600)


def test_a_pod_changing_its_cap_in_a_loop_is_held_to_a_rate(tmp_path: Path) -> None:
    board = FakeGpuBackend(2, "steady")
    keeper = CapKeeper(board, tmp_path / "caps.json")
    gpu = board.read()[0]
    keeper.set_limit(gpu, POD_A, 150.0)
    written = (tmp_path / "caps.json").stat().st_mtime_ns
    assert keeper.set_limit(gpu, POD_A, 150.0) == 150.0   # in force: nothing written
    assert (tmp_path / "caps.json").stat().st_mtime_ns == written
    other = board.read()[1]
    started = time.monotonic()
    changes = 0
    with pytest.raises(GpuError, match="times a second: refused"):
        for watts in range(140, 100, -1):   # as fast as it can ask
            keeper.set_limit(gpu, POD_A, float(watts))
            changes += 1
    # The burst (the first cap was one), and what the rate gave back meanwhile.
    assert changes + 1 <= CHANGE_BURST + (time.monotonic() - started) * CHANGES_PER_SECOND
    assert keeper.set_limit(other, POD_A, 160.0) == 160.0   # each GPU its own
    time.sleep(1 / CHANGES_PER_SECOND)
    assert keeper.set_limit(gpu, POD_A, 120.0) == 120.0


def test_a_pod_of_the_same_name_is_another_pod(tmp_path: Path) -> None:
    """Force-deleted and made again under its name: the old pod's volume going puts back
    its own caps alone, not the new one's, which the new pod's going puts back."""
    board = FakeGpuBackend(2, "steady")
    keeper = CapKeeper(board, tmp_path / "caps.json")
    again = PodRef(POD_A.namespace, POD_A.name, str(uuid.uuid4()), power_cap=True)
    g0, g1 = board.read()
    keeper.set_limit(g0, POD_A, 150.0)
    keeper.set_limit(g1, again, 160.0)
    keeper.restore_pod(POD_A.uid)
    assert board.limits == [TDP_WATTS, 160.0]
    keeper.restore_pod(again.uid)
    assert board.limits == [TDP_WATTS, TDP_WATTS]


def test_hundreds_of_volumes_are_served_again_after_a_restart(tmp_path: Path) -> None:
    """A volumes file far over the 64 KiB the agent once read (about 170 pods, with
    time-slicing), served again whole: no silent ceiling."""
    board = FakeGpuBackend(1, "steady")
    state = tmp_path / "state"
    state.mkdir()
    pods = [PodRef("team", f"p{i}", str(uuid.uuid4())) for i in range(400)]
    live = tmp_path / "live" / "mount"
    live.mkdir(parents=True)
    volumes = {str(tmp_path / "gone" / p.uid / "mount"): vars(p) for p in pods[1:]}
    volumes[str(live)] = vars(pods[0])
    (state / "volumes.json").write_text(json.dumps(volumes))
    assert (state / "volumes.json").stat().st_size > 64 * 1024
    node = Node(board, tmp_path / "kubelet", state, list_gpus=lambda: {})
    node.resume()
    assert node.served() == [pods[0]]
    assert not (state / "volumes.bad").exists()
    node.stop()


def test_the_liveness_probe_is_a_round_trip_that_fails_when_the_agent_is_wedged(
        tmp_path: Path) -> None:
    _, node, _ = capped_node(tmp_path)
    kubelet = Path(tempfile.mkdtemp(prefix="tj-"))   # a socket's path fits in 108 bytes
    csi = serve_csi(kubelet, "node-0", node.publish, node.unpublish, node.health)
    sock = kubelet / "plugins" / "node.throttledjob.io" / "csi.sock"
    try:
        assert probe(str(sock)) is None
        node.tidied -= STALE_SECONDS + 1   # no tidying pass for that long
        why = probe(str(sock))
        assert why is not None and "no tidying pass" in why
        done = subprocess.run([sys.executable, "-m", "throttledjob.node.probe", str(sock)],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 1 and "wedged" in done.stderr, done.stderr
        node.tidy()
        assert probe(str(sock)) is None
    finally:
        csi.stop(0).wait()
        node.stop()
        shutil.rmtree(kubelet)
    assert probe(str(tmp_path / "nobody.sock"), timeout_seconds=1) is not None


# In a process of its own (an audit hook stays for the process's life): every file the
# agent opens while it serves a caller, recorded.
OPENS = """
import json, os, sys, threading
from pathlib import Path
from throttledjob.node.caps import CapKeeper
from throttledjob.node.identity import PodRef
from throttledjob.node.socket_protocol import NodeAgent, serve
from throttledjob.gpu.fake import FakeGpuBackend
from throttledjob.gpu.node_backend import NodeAgentBackend
from throttledjob.gpu.backend import GpuError
tmp = Path(sys.argv[1])
board = FakeGpuBackend(1, "steady")
pod = PodRef("team", "train-a", "8b1f7f4e-0000-4000-8000-00000000000a", power_cap=True)
agent = NodeAgent(board, CapKeeper(board, tmp / "caps.json"), lambda: {})
server = serve(tmp / "agent.sock", agent, pod)
threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
opened = []
recording = threading.Event()
def hook(event, args):
    if event == "open" and recording.is_set() and threading.current_thread().daemon:
        opened.append(str(args[0]))
sys.addaudithook(hook)
recording.set()
try:
    NodeAgentBackend(tmp / "agent.sock").read()
except GpuError as e:
    refused = str(e)
recording.clear()
print(json.dumps({"opened": opened, "refused": refused, "pid": os.getpid()}))
"""


def test_the_agent_reads_the_callers_cgroup_and_nothing_else_of_it(tmp_path: Path) -> None:
    """What the agent opens while it serves a connection (Python's audit hook sees every
    open): the caller's /proc/<pid>/cgroup, and no other file of the caller's."""
    done = subprocess.run([sys.executable, "-c", OPENS, str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    # The caller is the script's own process (SO_PEERCRED names it).
    assert out["opened"] == [f"/proc/{out['pid']}/cgroup"], out
    assert "could not be told" in out["refused"]   # this process is in no pod


def test_a_sigterm_during_start_up_puts_the_caps_back_and_ends_the_agent_cleanly(
        tmp_path: Path) -> None:
    """The signal handlers are the agent's first instruction: a SIGTERM while it starts
    (here: waiting on a kubelet that accepts and never answers) is acted on once start-up
    ends, the caps put back, exit 0. It once killed the agent there, with the default
    action, before any cap was put back."""
    kubelet = Path(tempfile.mkdtemp(prefix="tj-"))   # a socket's path fits in 108 bytes
    (kubelet / "pod-resources").mkdir()
    silent = socket.socket(socket.AF_UNIX)
    silent.bind(str(kubelet / "pod-resources" / "kubelet.sock"))
    silent.listen(16)   # connects, never answers: each tidying pass waits 1 s on it
    state = tmp_path / "state"
    board_file = tmp_path / "board.json"
    board = FakeGpuBackend(1, "steady", limits_file=str(board_file))
    node = Node(board, kubelet, state, list_gpus=lambda: {POD_A.key: frozenset({fake_uuid(0)})})
    volume = kubelet / "pods" / POD_A.uid / "mount"
    volume.mkdir(parents=True)
    node.publish(volume, POD_A)   # served again at the restart: its cap is not put back
    node.keeper.set_limit(board.read()[0], POD_A, 150.0)
    for server, _ in node.listeners.values():
        server.close()
    env = {**os.environ, "THROTTLEDJOB_FAKE_GPUS": "1", "THROTTLEDJOB_FAKE_GPU_TRACE": "steady",
           "THROTTLEDJOB_FAKE_GPU_LIMITS_FILE": str(board_file)}
    agent = subprocess.Popen(
        [sys.executable, "-m", "throttledjob", "node", "--gpu-backend", "fake",
         "--node-name", "node-0", "--kubelet-dir", str(kubelet), "--state-dir", str(state),
         "--metrics-port", "0"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert "throttledjob node:" in agent.stderr.readline()   # the backend is open
        agent.send_signal(signal.SIGTERM)   # start-up: the kubelet's first call waits
        err = agent.stderr.read()
        assert agent.wait(timeout=30) == 0, err
    finally:
        agent.kill()
        silent.close()
        shutil.rmtree(kubelet)
    assert json.loads(board_file.read_text()) == [TDP_WATTS], err
    assert "Traceback" not in err, err
