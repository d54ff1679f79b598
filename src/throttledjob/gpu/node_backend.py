"""The GPUs of this pod, as the node agent (`throttledjob node`) serves them.

In a pod the sidecar has no GPU device files: the device plugin gives them only to the
containers that request `nvidia.com/gpu`. The node agent reads every GPU of the node and
answers each pod for its own GPUs (node/socket_protocol.py: the protocol, and how it knows the
pod). This backend is that conversation: a reading, a power limit range, a cap, and a
restore: the agent keeps each GPU's original limit (`keeps_originals`), so a sidecar
restarted while its GPU was capped still puts the right one back. An agent
that does not answer is a failed read (GpuError); after a few the GPU agent runs CPU-only,
the workload untouched, and asks again every 5 s until the agent answers.
"""

from __future__ import annotations

import contextlib
import json
import socket
from pathlib import Path
from typing import Any

from .backend import GpuBackend, GpuError, GpuReading


class NodeAgentBackend(GpuBackend):
    kind = "node agent"
    recovers = True   # a restarted agent (crash, DaemonSet roll) serves the pod again
    keeps_originals = True

    def __init__(self, path: Path, timeout_seconds: float = 2.0) -> None:
        self.path = path
        self.timeout_seconds = timeout_seconds
        self._sock: socket.socket | None = None
        self._file: Any = None
        self._uuids: dict[int, str] = {}   # index -> UUID, from the last read

    def read(self) -> list[GpuReading]:
        answer = self._ask({"op": "read"})
        self.simulated = bool(answer.get("simulated"))
        readings = [GpuReading.from_json(g) for g in answer.get("gpus") or []]
        self._uuids = {r.index: r.uuid for r in readings}
        return readings

    def power_limit_range_watts(self, index: int) -> tuple[float, float] | None:
        answer = self._ask({"op": "range", "uuid": self._uuid(index)})
        return float(answer["min"]), float(answer["max"])

    def set_power_limit_watts(self, index: int, watts: float) -> None:
        self._ask({"op": "set_power_limit", "uuid": self._uuid(index), "watts": watts})

    def original_power_limit_watts(self, index: int) -> float | None:
        # None from an agent older than the field: no lever there, the hold-back holds.
        original = self._ask({"op": "range", "uuid": self._uuid(index)}).get("original")
        return None if original is None else float(original)

    def restore_power_limit(self, index: int) -> None:
        self._ask({"op": "restore", "uuid": self._uuid(index)})

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = self._file = None

    def _uuid(self, index: int) -> str:
        if index not in self._uuids:
            raise GpuError(f"GPU {index} is not this pod's")
        return self._uuids[index]

    def _ask(self, request: dict) -> dict:
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self._sock.settimeout(self.timeout_seconds)
                self._sock.connect(str(self.path))
                self._file = self._sock.makefile("rb")
            with contextlib.suppress(OSError):   # refused at once: its reason is to read
                self._sock.sendall(json.dumps(request).encode() + b"\n")
            line = self._file.readline()
            if not line:
                raise OSError("the node agent closed the connection")
            answer = json.loads(line)
        except (OSError, ValueError) as e:
            self.close()
            raise GpuError(f"node agent not reachable: {e}") from None
        if not isinstance(answer, dict):
            raise GpuError("node agent: an answer that is not an object")
        if "error" in answer:
            raise GpuError(f"node agent: {answer['error']}")
        return answer
