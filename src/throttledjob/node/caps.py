"""The power caps the node agent set, and the limit each GPU had before: kept in a state
file on the node, so that a restarted agent still puts them back.

A board's power limit outlives the process that set it (until reset or reboot), so
whoever caps a GPU must put it back: when the pod that asked leaves (`restore_gone`), when
the agent is told to stop (`restore_all`), and at the agent's start, for caps whose pods
ended while it was down. A cap is never over the limit the GPU had before the first cap
(a caller cannot raise a limit), and is clamped to the board's range. The state is
written before the board is touched: an agent killed in between finds the original.
The pods' connections, the CSI calls and the tidying pass all call in: one lock makes each
cap or restore whole (a restore between a cap's record and its write to the board would
leave the board capped with no record, and the next cap would take it as the original).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from throttledjob.runtime.files import read_json_bounded, write_json_atomic
from throttledjob.sidecar.gpu.backend import GpuBackend, GpuError, GpuReading

log = logging.getLogger("throttledjob.node")


@dataclass(frozen=True)
class Cap:
    original_watts: float   # the GPU's limit before the first cap
    pod: str                # the pod that asked, "namespace/name"


class CapKeeper:
    def __init__(self, backend: GpuBackend, state_path: Path) -> None:
        self.backend = backend
        self.path = state_path
        self.caps: dict[str, Cap] = self._load()   # GPU UUID -> its cap
        self._lock = threading.RLock()

    def set_limit(self, gpu: GpuReading, pod: str, watts: float) -> float:
        """Cap `gpu` for `pod` at `watts`, within its range and never over the limit it
        had; at or over that limit, put it back. Returns the limit in force."""
        with self._lock:
            cap = self.caps.get(gpu.uuid)
            if cap is None:   # the limit now, not as read before the lock
                gpu = next((r for r in self.backend.read() if r.uuid == gpu.uuid), gpu)
            original = cap.original_watts if cap else gpu.power_limit_watts
            span = self.backend.power_limit_range_watts(gpu.index)
            if original is None or span is None:
                raise GpuError(f"GPU {gpu.uuid} has no settable power limit")
            wanted = min(original, span[1], max(span[0], watts))
            if wanted >= original:
                self.restore(gpu.uuid)
                return original
            if cap is None:
                self.caps[gpu.uuid] = Cap(original, pod)
                self._save()
            self.backend.set_power_limit_watts(gpu.index, wanted)
            return wanted

    def restore(self, uuid: str) -> None:
        """Put one GPU back to its own limit (nothing to do if it is not capped)."""
        with self._lock:
            cap = self.caps.get(uuid)
            if cap is None:
                return
            index = {r.uuid: r.index for r in self.backend.read()}.get(uuid)
            if index is None:
                log.warning("throttledjob node: GPU %s is gone; its cap is forgotten", uuid)
            else:
                self.backend.set_power_limit_watts(index, cap.original_watts)
                log.info("throttledjob node: GPU %s back to %.0f W", uuid, cap.original_watts)
            del self.caps[uuid]
            self._save()

    def restore_pod(self, pod: str) -> None:
        """Put back every cap `pod` asked for (its volume went: the pod is ending)."""
        self._restore_where(lambda uuid, cap: cap.pod == pod)

    def restore_gone(self, live_pods: set[str], shared: frozenset[str] = frozenset()) -> None:
        """Put back every cap whose pod no longer runs here, and every cap of a GPU now
        `shared` by several pods (a GPU shared is capped by none)."""
        self._restore_where(lambda uuid, cap: cap.pod not in live_pods or uuid in shared)

    def restore_all(self) -> None:
        self._restore_where(lambda uuid, cap: True)

    def _restore_where(self, which: Callable[[str, Cap], bool]) -> None:
        with self._lock:
            for uuid, cap in list(self.caps.items()):
                if which(uuid, cap):
                    try:
                        self.restore(uuid)
                    except (GpuError, OSError) as e:   # kept: tried again at the next pass
                        log.warning("throttledjob node: could not restore GPU %s: %s", uuid, e)

    def _load(self) -> dict[str, Cap]:
        """The caps on record; a file that cannot be read (a crash before it reached the
        disk) is set aside with one line in the log, not a crash at every start."""
        if not self.path.exists():
            return {}
        try:
            doc = read_json_bounded(str(self.path))
            return {uuid: Cap(float(c["original_watts"]), str(c["pod"]))
                    for uuid, c in (doc.get("caps") or {}).items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            aside = self.path.with_suffix(".bad")
            self.path.replace(aside)
            log.error("throttledjob node: %s unreadable (%s), moved to %s: its caps are not "
                      "put back by the agent", self.path, e, aside)
            return {}

    def _save(self) -> None:
        write_json_atomic(str(self.path),
                          {"caps": {uuid: asdict(c) for uuid, c in self.caps.items()}})
