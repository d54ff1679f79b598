"""The node agent's answers, and the Unix socket they go over.

One JSON request a line, one JSON answer a line, at most MAX_LINE bytes each way in:

    {"op": "read"}                                   -> {"gpus": [reading, ...], "simulated": b}
    {"op": "range", "uuid": U}                       -> {"min": W, "max": W, "original": W}
    {"op": "set_power_limit", "uuid": U, "watts": W} -> {"watts": W in force}
    {"op": "restore", "uuid": U}                     -> {"watts": W in force}

`original` is the limit the GPU gets back (the one it had before the first cap, which the
agent keeps); `restore` puts it back. A sidecar lifts its cap with `restore`, never by
writing a limit it read: restarted while its GPU was capped, it would have read the cap.

Every answer is for the caller's pod alone: each pod has a socket of its own (node/csi.py
makes it in the pod's volume), a caller whose cgroup names another pod, or no pod, is
refused (identity.py), and a pod sees and caps only the GPUs the kubelet gave it (`assignments`:
"namespace/name" -> GPU UUIDs, from the kubelet's PodResources API). A GPU shared by
several pods (time-slicing) is read by each but capped by none (a cap set while it had one
pod is put back). A refusal is an answer
(`{"error": ...}`); a line that is not JSON, or too long, closes the connection with one
line in the log, and the agent serves on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import socket
import socketserver
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from throttledjob.gpu.backend import GpuBackend, GpuError, GpuReading

from .caps import CapKeeper
from .identity import PodRef, peer_pod_uid

MAX_LINE = 4096
# Per pod: connections at once (its sidecar keeps one), and how long one may stay silent
# (the sidecar asks every interval): a workload holding sockets open costs the agent at
# most these threads, and for at most that long.
MAX_CONNECTIONS = 4
IDLE_SECONDS = 30.0
REFUSAL_LOG_SECONDS = 10.0
log = logging.getLogger("throttledjob.node")
# "namespace/name" -> the UUIDs of its GPUs (node/pod_resources.py).
Assignments = Callable[[], Mapping[str, frozenset[str]]]


class NodeAgent:
    def __init__(self, backend: GpuBackend, keeper: CapKeeper, assignments: Assignments,
                 serving: Callable[[PodRef], bool] = lambda pod: True) -> None:
        """`serving`: whether a pod's volume is still published (a request in flight
        when it went caps nothing)."""
        self.backend = backend
        self.keeper = keeper
        self.assignments = assignments
        self.serving = serving
        self._said: dict[str, float] = {}   # pod UID -> when a refusal of its was logged

    def answer(self, pod: PodRef, request: Any) -> dict:
        """The answer to one request from `pod`; a refused cap is said in the log too."""
        answer = self._answer(pod, request)
        if "error" in answer and isinstance(request, dict) \
                and request.get("op") == "set_power_limit":
            self._say_refused(pod, answer["error"])
        return answer

    def _say_refused(self, pod: PodRef, why: str) -> None:
        """One line a pod at most every REFUSAL_LOG_SECONDS: a pod asking in a loop must
        not flood the node's log."""
        now = time.monotonic()
        if now - self._said.get(pod.uid, -REFUSAL_LOG_SECONDS) >= REFUSAL_LOG_SECONDS:
            self._said = {u: t for u, t in self._said.items()
                          if now - t < REFUSAL_LOG_SECONDS}
            self._said[pod.uid] = now
            log.warning("throttledjob node: refused a cap of pod %s: %s", pod.key, why)

    def _answer(self, pod: PodRef, request: Any) -> dict:
        if not isinstance(request, dict):
            return {"error": "a request is a JSON object"}
        assigned = self.assignments()
        mine = assigned.get(pod.key, frozenset())
        if not mine:   # said in the pod's /status; its sidecar runs CPU-only meanwhile
            return {"error": f"the kubelet lists no GPU of pod {pod.key}"}
        try:
            readings = [r for r in self.backend.read_as(pod.key) if r.uuid in mine]
            op = request.get("op")
            if op == "read":
                return {"gpus": [r.as_json() for r in readings],
                        "simulated": self.backend.simulated}
            gpu = _one(readings, request.get("uuid"))
            if op == "range":
                span = self.backend.power_limit_range_watts(gpu.index)
                original = self.keeper.original_watts(gpu)
                return {"error": "no settable power limit"} if span is None or original is None \
                    else {"min": span[0], "max": span[1], "original": original}
            if op == "set_power_limit":
                return self._set_limit(pod, gpu, request.get("watts"), assigned)
            if op == "restore":
                self.keeper.restore(gpu.uuid)
                return {"watts": self.backend.power_management_limit_watts(gpu.index)}
            return {"error": f"unknown op {op!r}"}
        except (GpuError, OSError) as e:   # OSError: the state file could not be written
            return {"error": str(e)}

    def _set_limit(self, pod: PodRef, gpu: GpuReading, watts: Any,
                   assigned: Mapping[str, frozenset[str]]) -> dict:
        try:
            ok = not isinstance(watts, bool) and math.isfinite(watts) and watts > 0
        except (TypeError, OverflowError):
            ok = False
        if not ok:
            return {"error": "watts must be a positive number"}
        if not pod.power_cap:
            return {"error": f"pod {pod.key} may not cap its GPU: its ThrottledJob does not "
                             "allow levers.gpuPowerLimit"}
        if gpu.uuid in shared_gpus(assigned):
            self.keeper.restore(gpu.uuid)   # capped while it was one pod's
            return {"error": f"GPU {gpu.uuid} is shared with another pod: never capped"}
        return {"watts": self.keeper.set_limit(gpu, pod, float(watts),
                                               served=lambda: self.serving(pod))}


def shared_gpus(assigned: Mapping[str, frozenset[str]]) -> frozenset[str]:
    """The GPUs the kubelet lists for more than one pod (time-slicing): capped by none."""
    held = Counter(u for uuids in assigned.values() for u in uuids)
    return frozenset(u for u, pods in held.items() if pods > 1)


def _one(readings: list[GpuReading], uuid: Any) -> GpuReading:
    for r in readings:
        if r.uuid == uuid:
            return r
    raise GpuError(f"GPU {uuid!r} is not this pod's")


class _Connection(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        self.request.settimeout(self.server.idle_seconds)
        with contextlib.suppress(OSError):   # silent past the idle time, or gone
            self._serve()

    def _serve(self) -> None:
        pod = self.server.pod
        caller = peer_pod_uid(self.request, self.server.proc)
        refused = None
        if caller is None and not self.server.anonymous:
            # Gone, in no pod, or the agent is not in the host's process namespace.
            refused = "the caller's pod could not be told (the agent needs hostPID)"
        elif caller is not None and caller != pod.uid:
            refused = "this socket is another pod's"
        if refused:
            log.warning("throttledjob node: refused %s on the socket of pod %s",
                        f"pod {caller}" if caller else "a process of no pod", pod.key)
        while line := self.rfile.readline(MAX_LINE + 1):
            try:
                if len(line) > MAX_LINE or not line.endswith(b"\n"):
                    raise ValueError(f"a request over {MAX_LINE} bytes, or unterminated")
                request = json.loads(line)
            except (ValueError, RecursionError) as e:
                log.warning("throttledjob node: closing a connection from pod %s: %s",
                            pod.key, str(e).splitlines()[0][:200])
                return
            answer = {"error": refused} if refused \
                else self.server.agent.answer(pod, request)
            self.wfile.write(json.dumps(answer).encode() + b"\n")
            if refused:   # its one request answered, then closed
                return


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    # server_close() would join every connection's thread: one silent for IDLE_SECONDS
    # held the pod's unpublish (and its restore) that long.
    block_on_close = False

    def __init__(self, path: str, agent: NodeAgent, pod: PodRef, proc: Path,
                 idle_seconds: float, anonymous: bool) -> None:
        self.agent, self.pod, self.proc = agent, pod, proc
        self.idle_seconds, self.anonymous = idle_seconds, anonymous
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.open: set[socket.socket] = set()
        self.open_lock = threading.Lock()
        self.started = self.closed = False
        super().__init__(path, _Connection)

    def process_request(self, request: Any, client_address: Any) -> None:
        # Refused before a thread is started: a pod opening thousands of connections
        # costs the agent MAX_CONNECTIONS threads, not thousands.
        if not self.slots.acquire(blocking=False):
            with contextlib.suppress(OSError):
                request.sendall(b'{"error": "too many connections from this pod"}\n')
            self.shutdown_request(request)
            return
        with self.open_lock:
            self.open.add(request)
        try:
            super().process_request(request, client_address)
        except BaseException:
            # No thread (a pids limit, no memory): its slot and socket are given back
            # here, or the pod's socket would answer "too many connections" for ever.
            self._done(request)
            self.shutdown_request(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._done(request)

    def _done(self, request: Any) -> None:
        with self.open_lock:
            self.open.discard(request)
        self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.exception("throttledjob node: a connection of pod %s failed", self.pod.key)

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        with self.open_lock:
            if self.closed:   # closed before its thread ran: nothing to serve
                return
            self.started = True
        super().serve_forever(poll_interval)

    def close(self) -> None:
        """Stop listening and close the connections open now (a pod that ends, or the
        agent that stops, serves no request after this returns). Returns at once for a
        server whose thread never served (socketserver's shutdown() would wait for ever
        for a loop that never ran)."""
        with self.open_lock:
            self.closed = True
            started = self.started
        if started:
            self.shutdown()
        with self.open_lock:
            for conn in self.open:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        self.server_close()


def serve(path: Path, agent: NodeAgent, pod: PodRef, proc: Path = Path("/proc"),
          idle_seconds: float = IDLE_SECONDS, anonymous: bool = False) -> _Server:
    """Listen on `path` for `pod` (a stale socket file is replaced); the caller runs
    `serve_forever`. Any uid may connect: the socket is in that pod's volume alone.
    `anonymous`: also serve a caller whose pod cannot be told (the tests' own process,
    in no pod's cgroup); a node agent never does."""
    # Made in a directory the pod could once write to (its volume is mounted read-only
    # now): whatever is at the socket's name goes first, a directory too, and the mode is
    # set on the socket itself, never through a link put in its place.
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    path.unlink(missing_ok=True)
    # A socket's path must fit in 108 bytes, and a pod's volume on a node is
    # /var/lib/kubelet/pods/<uid>/volumes/kubernetes.io~csi/<volume>/mount/ (about 100):
    # bind through the directory's descriptor, a short path to the same place.
    directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        server = _Server(f"/proc/self/fd/{directory}/{path.name}", agent, pod, proc,
                         idle_seconds, anonymous)
        try:
            _make_connectable(directory, path.name)
        except OSError:
            server.server_close()
            raise
    finally:
        os.close(directory)
    return server


def _make_connectable(directory: int, name: str) -> None:
    """Any uid may connect (the pod's containers run as the user's): mode 0666 on the
    socket inode itself, opened without following a link."""
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW, dir_fd=directory)
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise OSError(f"{name} is not the agent's socket any more: refused")
        os.chmod(f"/proc/self/fd/{fd}", 0o666)
    finally:
        os.close(fd)
