"""The GPU board's power limit as a lever (`gpu_power_limit` in contracts.status.LEVERS),
one small object: what it needs, how it is applied, how it is put back.

- Needs: the policy to allow it (`levers.gpuPowerLimit: Allow`, or `--gpu-power-limit`),
  a board with a settable limit (the backend gives its range), and the right to set it
  (root on the node). Where one is missing it holds nothing and says why; the workload is
  then held back instead.
- Applied: each watched GPU capped at the limit asked, within its board's range and never
  over the limit it had (a target over an admin's lower limit leaves that limit alone).
  Nothing to cap and no cap of ours in force: the board is not written.
- The original: locally, the board's management limit (not the enforced one, which
  out-of-band limiters may hold lower), kept from the first cap while the board has the
  cap set; a limit found changed since is someone else's, the original from then on.
  Through the node agent (`backend.keeps_originals`), the agent's: it outlives this
  process, and a sidecar restarted mid-cap would have read the cap as the original.
- Restored: every GPU it capped, to the limit it had (on exit, when the GPU is lost, when
  the policy no longer allows it): written back locally, asked of the agent otherwise.
  The cap outlives the process that set it otherwise.
- Kept: a limit found over the one set (put back by someone else) is set again.
The clamp (`capped_limit`) and the precision a limit is read back at (`SAME_WATTS`) are the
board's, shared with the node agent: gpu/power_limit.py.
"""

from __future__ import annotations

import logging

from throttledjob.gpu.backend import GpuBackend, GpuError, GpuReading
from throttledjob.gpu.power_limit import SAME_WATTS, capped_limit

log = logging.getLogger("throttledjob.sidecar")


class PowerCap:
    name = "gpu_power_limit"

    def __init__(self, backend: GpuBackend) -> None:
        self.backend = backend
        self.saved: dict[int, float] = {}    # GPU index -> its limit before our cap (local)
        self.applied: dict[int, float] = {}  # GPU index -> our cap, while it is in force
        self.watched: set[int] = set()       # GPUs `apply` was given
        self.holds = False    # the caps hold the limit asked on every watched GPU
        self.capping = False  # a cap under a board's own limit is in force
        self.error: str | None = None

    def unsaved(self, readings: list[GpuReading]) -> bool:
        """A watched GPU not applied to yet (first read, or a GPU newly watched)."""
        return any(r.index not in self.watched for r in readings)

    def lifted(self, readings: list[GpuReading]) -> bool:
        """A GPU's limit is over the one set (someone put it back: the node agent at its
        SIGTERM, an admin): the cap is to be set again."""
        return any(r.index in self.applied and r.power_limit_watts is not None
                   and r.power_limit_watts > self.applied[r.index] + SAME_WATTS
                   for r in readings)

    def apply(self, readings: list[GpuReading], limit: float | None) -> None:
        """Cap every GPU of `readings` at `limit` (None: back to its own limit)."""
        holds, capping, self.error = limit is not None, False, None
        for r in readings:
            self.watched.add(r.index)
            try:
                if limit is None:
                    self._lift(r.index)
                    continue
                original = self._original(r.index)
                span = self.backend.power_limit_range_watts(r.index)
                if span is None or original is None:   # no such lever on this board
                    holds = False
                    continue
                wanted = capped_limit(limit, original, span)
                holds = holds and wanted <= limit
                if wanted < original:
                    self.backend.set_power_limit_watts(r.index, wanted)
                    self.applied[r.index] = wanted
                    capping = True
                else:   # the board's own limit is at or under the target
                    self._lift(r.index)
            except GpuError as e:
                self.error = f"cannot set the GPU power limit: {e}"
                log.warning("throttledjob: %s", self.error)
                holds = False
                break
        # A cap only holds the target if it binds below the board's own limit on every GPU.
        self.holds = holds and capping and bool(readings)
        self.capping = capping

    def restore(self) -> None:
        """Every GPU capped back to the limit it had (best effort: one may be gone)."""
        for index in list(self.applied):
            try:
                self._lift(index)
            except GpuError as e:
                log.warning("throttledjob: could not restore the power limit of GPU %d: %s",
                            index, e)
        self.saved.clear()
        self.applied.clear()
        self.watched.clear()
        self.capping = self.holds = False

    def _original(self, index: int) -> float | None:
        """The limit GPU `index` had before our cap (None: it has no settable one)."""
        if self.backend.keeps_originals:
            return self.backend.original_power_limit_watts(index)
        now = self.backend.power_management_limit_watts(index)
        if now is None:
            return None
        ours = self.applied.get(index)
        if ours is None or abs(now - ours) > SAME_WATTS:
            # Not capped by us, or changed by someone since: the board's own limit.
            self.saved[index] = now
            self.applied.pop(index, None)
        return self.saved[index]

    def _lift(self, index: int) -> None:
        """GPU `index` back to its own limit, where a cap of ours may be in force: the node
        agent knows (a cap of this pod's sidecar before a restart is lifted too); locally,
        only a GPU this object capped is written."""
        if self.backend.keeps_originals:
            self.backend.restore_power_limit(index)
        elif index in self.applied:
            self.backend.set_power_limit_watts(index, self.saved[index])
        self.applied.pop(index, None)
