"""The GPU half of a control cycle: read the backend, keep peaks, decide a duty, and
own the opt-in power-limit lever. Degrades to CPU-only when the GPUs go away.
"""

from __future__ import annotations

import collections
import logging

from .gpu import GpuBackend, GpuError, GpuReading, NullGpuBackend, select_gpus
from .gpu_controller import GpuController, GpuDecision, GpuObservation
from .policy import Policy
from .stats import PeakStats

log = logging.getLogger("throttledjob.sidecar")
# Recent 1-second samples kept for "is the target met now" (the run-long p99 remembers
# the start-up, before the controller acted).
RECENT_SAMPLES = 60
# Consecutive failed reads before transient errors count as a lost GPU.
MAX_FAILED_READS = 3


class GpuAgent:
    def __init__(self, backend: GpuBackend, policy: Policy, power_limit_lever: bool = False,
                 note: str = "") -> None:
        self.backend = backend
        self.note = note
        self.power_limit_lever = power_limit_lever
        self.readings: list[GpuReading] = []
        self.util_stats = PeakStats(resolution=0.005)
        self.power_stats = PeakStats(resolution=0.5)
        self.recent_util: collections.deque[float] = collections.deque(maxlen=RECENT_SAMPLES)
        self.recent_power: collections.deque[float] = collections.deque(maxlen=RECENT_SAMPLES)
        self.decision: GpuDecision | None = None
        self.error: str | None = None
        self.read_errors = 0
        self.error_lost = False
        self._failed_reads = 0
        self._window: list[tuple[float, float | None, float]] = []
        self._saved_limits: dict[int, float] = {}
        self.controller = GpuController()
        self.set_policy(policy)

    @property
    def kind(self) -> str:
        return self.backend.kind

    @property
    def telemetry(self) -> str:
        if self.backend.kind == "none":
            return "none"
        return "fake (simulated)" if self.backend.simulated else self.backend.kind

    def set_policy(self, policy: Policy) -> None:
        util = policy.gpu_peak_utilization_percent
        targets = (None if util is None else util / 100.0, policy.gpu_peak_power_watts)
        if (targets != (self.controller.targets["utilization"], self.controller.targets["power"])
                or self.controller.max_duty != policy.max_pause_fraction):
            duty = self.controller.duty
            self.controller = GpuController(*targets, max_duty=policy.max_pause_fraction)
            # Keep the duty in force: a new target moves from here, not from zero.
            self.controller.duty = min(duty, self.controller.max_duty) if any(
                t is not None for t in targets) else 0.0
        self.policy = policy
        if hasattr(self.backend, "memory_fraction"):  # the simulator honours the cap
            self.backend.memory_fraction = policy.gpu_memory_fraction
        if self.power_limit_lever and self.readings:
            self._apply_power_limits()

    def cycle(self, elapsed: float, pause_fraction: float, visible: list[str]) -> float | None:
        """Read, record and decide; returns the duty wanted (None: no GPU target)."""
        if isinstance(self.backend, NullGpuBackend):
            return None
        self.backend.observe_pause(pause_fraction)
        try:
            self.readings = select_gpus(self.backend.read(), visible)
            self._failed_reads = 0
            self.error = None
        except GpuError as e:
            self._read_failed(e)
            return self.decision.duty if self.decision and not self.error_lost else None
        if self.power_limit_lever and not self._saved_limits:
            self._apply_power_limits()
        util = max((r.utilization_ratio for r in self.readings), default=None)
        power = max((r.power_watts for r in self.readings if r.power_watts is not None),
                    default=None)
        self._record(elapsed, util, power)
        if not self.controller.active:
            self.decision = None
            return None
        self.decision = self.controller.update(
            GpuObservation(util, power, duty=pause_fraction))
        return self.decision.duty

    def _read_failed(self, e: GpuError) -> None:
        self.read_errors += 1
        self._failed_reads += 1
        if e.lost or self._failed_reads >= MAX_FAILED_READS:
            # Say it once, drop the GPU series, and keep controlling the CPU.
            self.error = f"GPU telemetry lost ({e}); running CPU-only"
            self.error_lost = True
            log.warning("throttledjob: %s", self.error)
            self.readings = []
            self.decision = None
            self.backend.close()
            self.backend = _LostBackend(self.backend)
        else:
            self.error = f"GPU read failed ({e}); keeping the last duty"

    def _record(self, elapsed: float, util: float | None, power: float | None) -> None:
        # Peaks are over 1-second samples whatever the control interval (as for the CPU).
        self._window.append((elapsed, util, power if power is not None else -1.0))
        total = sum(w[0] for w in self._window)
        if total < 0.999:
            return
        if util is not None:
            u = sum(w[0] * (w[1] or 0.0) for w in self._window) / total
            self.util_stats.add(u)
            self.recent_util.append(u)
        if power is not None:
            p = sum(w[0] * max(0.0, w[2]) for w in self._window) / total
            self.power_stats.add(p)
            self.recent_power.append(p)
        self._window = []

    def _apply_power_limits(self) -> None:
        target = self.policy.gpu_peak_power_watts
        for r in self.readings:
            try:
                if r.index not in self._saved_limits and r.power_limit_watts is not None:
                    self._saved_limits[r.index] = r.power_limit_watts
                original = self._saved_limits.get(r.index)
                span = self.backend.power_limit_range_watts(r.index)
                if target is None or span is None:
                    wanted = original
                else:
                    wanted = min(span[1], max(span[0], target))
                if wanted is not None:
                    self.backend.set_power_limit_watts(r.index, wanted)
            except GpuError as e:
                self.error = f"cannot set the GPU power limit: {e}"
                log.warning("throttledjob: %s", self.error)
                return

    def report(self) -> dict:
        """The GPU part of local mode's JSON report."""
        def peak(stats: PeakStats, scale: float = 1.0) -> dict | None:
            if not stats.count:
                return None
            return {"p99": round(stats.p99 * scale, 2), "max": round(stats.max * scale, 2)}

        return {
            "telemetry": self.telemetry,
            "utilization_percent": peak(self.util_stats, 100.0),
            "power_watts": peak(self.power_stats),
            "target_utilization_percent": self.policy.gpu_peak_utilization_percent,
            "target_power_watts": self.policy.gpu_peak_power_watts,
            "error": self.error,
        }

    def close(self) -> None:
        """Restore every power limit this agent changed, then release the library."""
        for index, watts in self._saved_limits.items():
            try:
                self.backend.set_power_limit_watts(index, watts)
            except GpuError as e:
                log.warning("throttledjob: could not restore the power limit of GPU %d: %s",
                            index, e)
        self._saved_limits.clear()
        self.backend.close()


class _LostBackend(NullGpuBackend):
    """What is left after the GPUs went away: no readings, the old name in /status."""

    def __init__(self, lost: GpuBackend) -> None:
        self.kind = lost.kind
        self.simulated = lost.simulated
