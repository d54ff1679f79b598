"""The GPU board's power limit as a lever (`gpu_power_limit` in contracts.status.LEVERS),
one small object: what it needs, how it is applied, how it is put back.

- Needs: the policy to allow it (`levers.gpuPowerLimit: Allow`, or `--gpu-power-limit`),
  a board with a settable limit (the backend gives its range), and the right to set it
  (root on the node). Where one is missing it holds nothing and says why; the workload is
  then held back instead.
- Applied: each watched GPU capped at the limit asked, within its board's range; the limit
  each GPU had before is kept the first time it is capped.
- Restored: every GPU it capped, to the limit it had (on exit, when the GPU is lost, when
  the policy no longer allows it). The cap outlives the process that set it otherwise.
- Kept: a limit found over the one set (put back by someone else) is set again.
"""

from __future__ import annotations

import logging

from .backend import GpuBackend, GpuError, GpuReading

log = logging.getLogger("throttledjob.sidecar")


class PowerCap:
    name = "gpu_power_limit"

    def __init__(self, backend: GpuBackend) -> None:
        self.backend = backend
        self.saved: dict[int, float] = {}  # GPU index -> its limit before the first cap
        self.applied: dict[int, float] = {}  # GPU index -> the limit last set
        self.holds = False    # the caps hold the limit asked on every watched GPU
        self.capping = False  # a cap under a board's own limit is in force
        self.error: str | None = None

    def unsaved(self, readings: list[GpuReading]) -> bool:
        """A watched GPU not capped yet (first read, or a GPU newly watched)."""
        return any(r.index not in self.saved for r in readings)

    def lifted(self, readings: list[GpuReading]) -> bool:
        """A GPU's limit is over the one set (someone put it back: the node agent at its
        SIGTERM, an admin): the cap is to be set again."""
        return any(r.index in self.applied and r.power_limit_watts is not None
                   and r.power_limit_watts > self.applied[r.index] + 0.5 for r in readings)

    def apply(self, readings: list[GpuReading], limit: float | None) -> None:
        """Cap every GPU of `readings` at `limit` (None: back to its own limit)."""
        holds, capping, self.error = limit is not None, False, None
        for r in readings:
            try:
                if r.index not in self.saved and r.power_limit_watts is not None:
                    self.saved[r.index] = r.power_limit_watts
                original = self.saved.get(r.index)
                span = self.backend.power_limit_range_watts(r.index)
                if span is None or original is None:   # no such lever on this board
                    holds = False
                    continue
                wanted = original if limit is None else min(span[1], max(span[0], limit))
                holds = holds and wanted <= limit
                capping = capping or wanted < original
                self.backend.set_power_limit_watts(r.index, wanted)
                self.applied[r.index] = wanted
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
        for index, watts in self.saved.items():
            try:
                self.backend.set_power_limit_watts(index, watts)
            except GpuError as e:
                log.warning("throttledjob: could not restore the power limit of GPU %d: %s",
                            index, e)
        self.saved.clear()
        self.applied.clear()
        self.capping = self.holds = False
