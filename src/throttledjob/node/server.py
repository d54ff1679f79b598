"""The node agent's answers, and the Unix socket they go over.

One JSON request a line, one JSON answer a line, at most MAX_LINE bytes each way in:

    {"op": "read"}                                   -> {"gpus": [reading, ...], "simulated": b}
    {"op": "range", "uuid": U}                       -> {"min": W, "max": W}
    {"op": "set_power_limit", "uuid": U, "watts": W} -> {"watts": W in force}

Every answer is for the caller's pod alone: each pod has a socket of its own (node/csi.py
makes it in the pod's volume), a caller whose cgroup names another pod is refused
(identity.py), and a pod sees and caps only the GPUs the kubelet gave it (`assignments`:
"namespace/name" -> GPU UUIDs, from the kubelet's PodResources API). A GPU shared by
several pods (time-slicing) is read by each but capped by none. A refusal is an answer
(`{"error": ...}`); a line that is not JSON, or too long, closes the connection with one
line in the log, and the agent serves on.
"""

from __future__ import annotations

import json
import logging
import os
import socketserver
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from throttledjob.sidecar.gpu.backend import GpuBackend, GpuError, GpuReading

from .caps import CapKeeper
from .identity import PodRef, peer_pod_uid

MAX_LINE = 4096
# Per pod: connections at once (its sidecar keeps one), and how long one may stay silent
# (the sidecar asks every interval): a workload holding sockets open costs the agent at
# most these threads, and for at most that long.
MAX_CONNECTIONS = 4
IDLE_SECONDS = 30.0
log = logging.getLogger("throttledjob.node")
# "namespace/name" -> the UUIDs of its GPUs (node/pod_resources.py).
Assignments = Callable[[], Mapping[str, frozenset[str]]]


class NodeAgent:
    def __init__(self, backend: GpuBackend, keeper: CapKeeper, assignments: Assignments) -> None:
        self.backend = backend
        self.keeper = keeper
        self.assignments = assignments

    def answer(self, pod: PodRef, request: Any) -> dict:
        """The answer to one request from `pod`."""
        if not isinstance(request, dict):
            return {"error": "a request is a JSON object"}
        assigned = self.assignments()
        mine = assigned.get(pod.key, frozenset())
        if not mine:   # said in the pod's /status, where its sidecar gives up on GPUs
            return {"error": f"the kubelet lists no GPU of pod {pod.key}"}
        try:
            readings = [r for r in self.backend.read() if r.uuid in mine]
            op = request.get("op")
            if op == "read":
                return {"gpus": [r.as_json() for r in readings],
                        "simulated": self.backend.simulated}
            gpu = _one(readings, request.get("uuid"))
            if op == "range":
                span = self.backend.power_limit_range_watts(gpu.index)
                return {"error": "no settable power limit"} if span is None \
                    else {"min": span[0], "max": span[1]}
            if op == "set_power_limit":
                return self._set_limit(pod, gpu, request.get("watts"), assigned)
            return {"error": f"unknown op {op!r}"}
        except GpuError as e:
            return {"error": str(e)}

    def _set_limit(self, pod: PodRef, gpu: GpuReading, watts: Any,
                   assigned: Mapping[str, frozenset[str]]) -> dict:
        if isinstance(watts, bool) or not isinstance(watts, (int, float)) or watts <= 0:
            return {"error": "watts must be a positive number"}
        if any(gpu.uuid in uuids for other, uuids in assigned.items() if other != pod.key):
            return {"error": f"GPU {gpu.uuid} is shared with another pod: never capped"}
        return {"watts": self.keeper.set_limit(gpu, pod.key, float(watts))}


def _one(readings: list[GpuReading], uuid: Any) -> GpuReading:
    for r in readings:
        if r.uuid == uuid:
            return r
    raise GpuError(f"GPU {uuid!r} is not this pod's")


class _Connection(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        slot = self.server.slots.acquire(blocking=False)
        try:
            self.request.settimeout(self.server.idle_seconds)
            if slot:
                self._serve()
            else:   # its one request answered with the refusal, then closed
                self.rfile.readline(MAX_LINE + 1)
                self.wfile.write(b'{"error": "too many connections from this pod"}\n')
        except OSError:   # silent past the idle time, or gone
            pass
        finally:
            if slot:
                self.server.slots.release()

    def _serve(self) -> None:
        pod = self.server.pod
        caller = peer_pod_uid(self.request, self.server.proc)
        refused = caller is not None and caller != pod.uid
        if refused:
            log.warning("throttledjob node: refused pod %s on the socket of pod %s",
                        caller, pod.key)
        while line := self.rfile.readline(MAX_LINE + 1):
            try:
                if len(line) > MAX_LINE or not line.endswith(b"\n"):
                    raise ValueError(f"a request over {MAX_LINE} bytes, or unterminated")
                request = json.loads(line)
            except ValueError as e:
                log.warning("throttledjob node: closing a connection from pod %s: %s",
                            pod.key, str(e).splitlines()[0][:200])
                return
            answer = {"error": "this socket is another pod's"} if refused \
                else self.server.agent.answer(pod, request)
            self.wfile.write(json.dumps(answer).encode() + b"\n")
            if refused:   # its one request answered, then closed
                return


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, agent: NodeAgent, pod: PodRef, proc: Path,
                 idle_seconds: float) -> None:
        self.agent, self.pod, self.proc = agent, pod, proc
        self.idle_seconds = idle_seconds
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(path, _Connection)


def serve(path: Path, agent: NodeAgent, pod: PodRef, proc: Path = Path("/proc"),
          idle_seconds: float = IDLE_SECONDS) -> _Server:
    """Listen on `path` for `pod` (a stale socket file is replaced); the caller runs
    `serve_forever`. Any uid may connect: the socket is in that pod's volume alone."""
    path.unlink(missing_ok=True)
    # A socket's path must fit in 108 bytes, and a pod's volume on a node is
    # /var/lib/kubelet/pods/<uid>/volumes/kubernetes.io~csi/<volume>/mount/ (about 100):
    # bind through the directory's descriptor, a short path to the same place.
    directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        server = _Server(f"/proc/self/fd/{directory}/{path.name}", agent, pod, proc,
                         idle_seconds)
    finally:
        os.close(directory)
    os.chmod(path, 0o666)
    return server
