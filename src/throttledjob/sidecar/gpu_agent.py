"""The GPU half of a control cycle: read the backend, keep peaks, decide a duty, and
own the opt-in power-limit lever. Degrades to CPU-only when the GPUs go away (for good,
unless the backend recovers: the node agent is asked again every 5 s).

With the lever, a power target is held by capping the board at the controller's setpoint
(the prior: the cap changes nothing until the workload draws that much), and the hold-back
duty answers only for what the cap cannot hold (a utilization target, a board whose
minimum limit is over the target). Once the workload reports steps, the explorer
(sidecar/gpu_explorer.py) measures whether the cap or the hold-back alone costs less.

The sidecar's GPU control loop, over the device layer (throttledjob.gpu: the backends):
gpu_agent.py       this: one GPU control cycle, and `open_gpu_agent`
gpu_controller.py  the duty control law (pure)
gpu_demand.py      what a GPU would draw unheld, for a GPU-watt budget (pure)
gpu_explorer.py    the power-limit explorer (pure)
gpu_power_cap.py   the power-limit lever
gpu_simulate.py    what feeds simulated GPUs: a test harness, or a live run's GPU agent
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from throttledjob.contracts.policy import Policy
from throttledjob.gpu import open_backend
from throttledjob.gpu.backend import GpuBackend, GpuError, GpuReading, NullGpuBackend, select_gpus

from .gpu_controller import DEFAULT_MARGIN, GpuController, GpuDecision, GpuObservation
from .gpu_demand import uncapped_watts
from .gpu_explorer import UNCAPPED, GpuSample, PowerLimitExplorer
from .gpu_power_cap import PowerCap
from .stats import PeakSummary, PeakTracker

log = logging.getLogger("throttledjob.sidecar")
# Intervals the duty tracks the control law down after the cap is lifted (it converges
# from above, a third of the way or more per interval).
TRACK_INTERVALS = 8
# Consecutive failed reads before transient errors count as a lost GPU.
MAX_FAILED_READS = 3
# A lost backend that recovers (the node agent) is asked again this often: an agent that
# accepts and never answers costs a read's timeout (2 s) at most this often, not each cycle.
LOST_RETRY_SECONDS = 5.0
# A GPU this little busy draws its floor: the least any hold-back can bring it to.
IDLE_UTILIZATION = 0.05


def idle_draw(r: GpuReading) -> float | None:
    """What the GPU draws, where it idles (None: busy, or no power reading)."""
    return r.power_watts if r.utilization_ratio <= IDLE_UTILIZATION else None


def under_the_floor(target_watts: float | None, readings: list[GpuReading]) -> str | None:
    """Why a power target cannot be held, where an idle GPU already draws more than it:
    holding the workload back brings a board down to its idle draw, never below."""
    if target_watts is None:
        return None
    for r in readings:
        draw = idle_draw(r)
        if draw is not None and draw > target_watts:
            return (f"GPU power target {target_watts:g} W is under GPU {r.index}'s idle draw "
                    f"({draw:.0f} W): holding the work back cannot go below it")
    return None


@dataclass(frozen=True)
class GpuSeen:
    """One interval's reading of the watched GPUs, as the controller sees it: the
    busiest one's utilization and power (None: not readable), and whether the board's
    power cap held any of them back."""

    utilization: float | None
    power_watts: float | None
    capped: bool


@dataclass(frozen=True)
class GpuState:
    """What the GPU half saw and holds after a cycle (part of the agent's CycleResult)."""

    telemetry: str                  # "nvml", "fake (simulated)" or "none"
    readings: tuple[GpuReading, ...]
    utilization: PeakSummary        # of the busiest watched GPU, ratio 0..1
    power: PeakSummary              # of the busiest watched GPU, watts
    power_limit_lever: bool         # the lever is allowed (levers.gpuPowerLimit)
    capping: bool                   # a cap under the board's own limit is in force
    error: str | None
    # The watched GPUs' draw with no cap and no hold-back, summed (gpu_demand.py; None:
    # no power reading), and each one's (min, max) power limit where it has one.
    demand_watts: float | None = None
    ranges: tuple[tuple[float, float] | None, ...] = ()


class GpuAgent:
    def __init__(self, backend: GpuBackend, policy: Policy, note: str = "") -> None:
        self.backend = backend
        self.note = note
        # The GPUs to watch where no cooperating process has declared its own (only a
        # process that steps writes a record): local mode's command's CUDA_VISIBLE_DEVICES.
        self.default_visible: list[str] = []
        # The power-limit lever, while the policy allows it (set_policy).
        self.cap: PowerCap | None = None
        self.readings: list[GpuReading] = []
        self.util_stats = PeakTracker(resolution=0.005)
        self.power_stats = PeakTracker(resolution=0.5)
        # Fraction of the interval being read that the workload was held back.
        self.hold_back = 0.0
        self.steps_seen = 0.0   # what the workload reported done so far
        self.decision: GpuDecision | None = None
        self.error: str | None = None
        self.read_errors = 0
        self.error_lost = False
        self._failed_reads = 0
        self._retry_in = 0.0   # lost, of a backend that recovers: seconds to the next ask
        self._limits_stale = True
        self.explorer: PowerLimitExplorer | None = None
        self._tracking = 0   # intervals left in which the duty tracks the law both ways
        # The least power read while a watched GPU idled: the floor of the power law.
        self.floor_watts: float | None = None
        self._ranges: dict[str, tuple[float, float] | None] = {}  # by UUID, read once
        self.controller = GpuController()
        self.policy = policy
        self.set_policy(policy)

    @property
    def kind(self) -> str:
        return self.backend.kind

    @property
    def telemetry(self) -> str:
        if self.backend.kind == "none":
            return "none"
        return "fake (simulated)" if self.backend.simulated else self.backend.kind

    @property
    def power_limit_lever(self) -> bool:
        return self.cap is not None

    @property
    def cap_holds(self) -> bool:
        """The board's caps hold the power target (the duty need not)."""
        return bool(self.cap and self.cap.holds)

    @property
    def capping(self) -> bool:
        """A cap under the board's own limit is in force."""
        return bool(self.cap and self.cap.capping)

    def set_policy(self, policy: Policy) -> None:
        if policy.gpu_peak_power_watts != self.policy.gpu_peak_power_watts:
            self.explorer = None   # what it measured was for another target
        if policy.allows_gpu_power_limit and self.cap is None:
            self.cap = PowerCap(self.backend)
        elif not policy.allows_gpu_power_limit and self.cap is not None:
            self.cap.restore()
            self.cap, self.explorer = None, None
        self.policy = policy
        self._sync_controller()
        self._limits_stale = True   # applied at the next read, to every GPU watched then

    @property
    def cap_watts(self) -> float | None:
        """The power limit that holds the target: the controller's setpoint, so that the
        duty does not act on top of the cap (None: no target, or the lever is off)."""
        target = self.policy.gpu_peak_power_watts
        if self.cap is None or target is None:
            return None
        return target * (1.0 - DEFAULT_MARGIN)

    @property
    def power_limit_watts(self) -> float | None:
        """The cap wanted now: the explorer's choice, else the prior (the cap)."""
        return self.explorer.limit if self.explorer else self.cap_watts

    def _sync_controller(self) -> None:
        p = self.policy
        util = p.gpu_peak_utilization_percent
        power = None if self.cap_holds else p.gpu_peak_power_watts
        targets = (None if util is None else util / 100.0, power)
        if (targets != (self.controller.targets["utilization"], self.controller.targets["power"])
                or self.controller.max_duty != p.max_pause_fraction):
            duty, track = self.controller.duty, self.controller.track
            self.controller = GpuController(*targets, max_duty=p.max_pause_fraction)
            # Keep the duty in force: a new target moves from here, not from zero.
            self.controller.duty = min(duty, self.controller.max_duty) if any(
                t is not None for t in targets) else 0.0
            self.controller.track = track

    @property
    def budget_exhausted(self) -> bool:
        """The GPU controller's own verdict in the last cycle: its duty held back by the
        budget while over its target (decide.budget_exhausted reads it)."""
        return bool(self.decision and self.decision.budget_exhausted)

    def cycle(self, elapsed: float, pause_fraction: float, visible: list[str],
              steps: float = 0.0) -> float | None:
        """Measure, decide, act; returns the duty wanted (None: no GPU target).
        `pause_fraction`: how much of the interval the workload was held back; `steps`:
        what it reported done over the interval."""
        if isinstance(self.backend, NullGpuBackend):
            return None
        if self.error_lost:   # a backend that recovers: asked again every few seconds
            self._retry_in -= elapsed
            if self._retry_in > 0:
                return None
            self._retry_in = LOST_RETRY_SECONDS
        # What the simulated board reads (gpu/simulate.py).
        self.hold_back, self.steps_seen = pause_fraction, self.steps_seen + steps
        seen = self._measure(elapsed, visible or self.default_visible)
        if seen is None:   # the read failed: the last duty, until the GPU counts as lost
            return self.decision.duty if self.decision and not self.error_lost else None
        if self.cap and (self._limits_stale or self.cap.unsaved(self.readings)
                         or self.cap.lifted(self.readings)):
            # First read, a policy edit, a GPU newly watched, or a cap someone put back.
            self._apply_power_limits()
        self.decision = self._decide(seen, elapsed, pause_fraction, steps)
        return self.decision.duty if self.decision else None

    def _measure(self, elapsed: float, visible: list[str]) -> GpuSeen | None:
        """Read the watched GPUs, keep their peaks and the board's floor; None: the read
        failed (_read_failed says so)."""
        try:
            self.readings = select_gpus(self.backend.read(), visible)
            self._failed_reads = 0
            self.error = None
            if self.error_lost:   # a backend that recovers answered again
                log.warning("throttledjob: GPU telemetry back (%s)", self.backend.kind)
                self.error_lost = False
                self._limits_stale = True   # its caps may have been put back meanwhile
        except GpuError as e:
            self._read_failed(e)
            return None
        seen = GpuSeen(
            utilization=max((r.utilization_ratio for r in self.readings), default=None),
            power_watts=max((r.power_watts for r in self.readings
                             if r.power_watts is not None), default=None),
            capped=any("sw_power_cap" in r.throttle_reasons for r in self.readings))
        self._record(elapsed, seen.utilization, seen.power_watts)
        self._learn_floor()
        return seen

    def _decide(self, seen: GpuSeen, elapsed: float, pause_fraction: float,
                steps: float) -> GpuDecision | None:
        """The duty the controller wants; once the workload reports steps under a cap,
        the explorer's measurement of cap against hold-back (which may move the cap)."""
        if not self.controller.active and not self.cap_holds:
            return None
        self.decision = self.controller.update(GpuObservation(
            seen.utilization, seen.power_watts, duty=pause_fraction,
            floor_watts=self.floor_watts or 0.0))
        power = seen.power_watts
        if power is not None and steps > 0 and self.explorer is None and self.capping:
            self.explorer = PowerLimitExplorer(self.policy.gpu_peak_power_watts,
                                               self.cap_watts)
        if self.explorer and power is not None:
            self._explore(GpuSample(steps, elapsed, power, pause_fraction, seen.capped))
        return self.decision

    def _explore(self, sample: GpuSample) -> None:
        ex = self.explorer
        before = ex.limit
        ex.update(sample)
        self._tracking = max(0, self._tracking - 1)
        self.controller.track = ex.probing or self._tracking > 0
        if ex.limit == before:
            return
        self._apply_power_limits()
        # After a switch the duty follows the law both ways for a while: down from the
        # preset below, or off what was held back for power when the cap is back.
        self.controller.track, self._tracking = True, TRACK_INTERVALS
        if ex.limit is UNCAPPED:
            # Lifting the cap: hold back what it last needed (else all the budget allows).
            known = ex.uncapped_duty
            self.controller.duty = self.controller.max_duty if known is None \
                else min(self.controller.max_duty, known + 0.05)
        duty = self.controller.asked()   # a cap that holds the target takes the duty's place
        self.decision = GpuDecision(duty, duty > 0, False, "power" if duty > 0 else None)

    def _learn_floor(self) -> None:
        """The lowest idle draw of any watched GPU: lower than the busiest GPU's own floor
        at worst, which makes the law under-correct (it converges from above)."""
        idle = [d for d in map(idle_draw, self.readings) if d is not None]
        if self.floor_watts is not None:
            idle.append(self.floor_watts)
        self.floor_watts = min(idle, default=None)

    def _read_failed(self, e: GpuError) -> None:
        self.read_errors += 1
        self._failed_reads += 1
        if not (e.lost or self._failed_reads >= MAX_FAILED_READS):
            self.error = f"GPU read failed ({e}); keeping the last duty"
            return
        # Lost: drop the GPU series and keep controlling the CPU, said once. A backend
        # that recovers (the node agent restarting) is kept and asked again later.
        recovers = self.backend.recovers and not e.lost
        self.error = f"GPU telemetry lost ({e}); running CPU-only" + (
            " until it answers" if recovers else "")
        if not self.error_lost:
            log.warning("throttledjob: %s", self.error)
        self.error_lost = True
        self.readings = []
        self.decision = None
        if recovers:
            self.controller.stand_down()
            if self.cap is not None:   # the agent puts caps back as it stops
                self.cap.capping = self.cap.holds = False
            self._retry_in = LOST_RETRY_SECONDS
        else:
            self._restore_power_limits()   # best effort: the board may still be there
            self.backend.close()
            self.backend = _LostBackend(self.backend)

    def _record(self, elapsed: float, util: float | None, power: float | None) -> None:
        # An unreadable series counts as 0 in the window, which makes a sample only if the
        # series was readable at its close.
        self.util_stats.add(elapsed * (util or 0.0), elapsed, valid=util is not None)
        self.power_stats.add(elapsed * max(0.0, power or 0.0), elapsed, valid=power is not None)

    def state(self) -> GpuState:
        ranges = tuple(self._range(r) for r in self.readings)
        wanted = [uncapped_watts(r, self.hold_back, self.floor_watts, span and span[1])
                  for r, span in zip(self.readings, ranges, strict=True)]
        return GpuState(self.telemetry, tuple(self.readings), self.util_stats.summary(),
                        self.power_stats.summary(), self.power_limit_lever, self.capping,
                        self.error,
                        None if not wanted or None in wanted else sum(w or 0.0 for w in wanted),
                        ranges)

    def _range(self, r: GpuReading) -> tuple[float, float] | None:
        """The board's (min, max) power limit, asked once (None: it has none)."""
        if r.uuid not in self._ranges:
            try:
                self._ranges[r.uuid] = self.backend.power_limit_range_watts(r.index)
            except GpuError:
                return None
        return self._ranges[r.uuid]

    def _apply_power_limits(self) -> None:
        self._limits_stale = False
        if self.cap is not None:
            self.cap.apply(self.readings, self.power_limit_watts)
            self.error = self.cap.error or self.error
        self._sync_controller()

    def _restore_power_limits(self) -> None:
        if self.cap is not None:
            self.cap.restore()

    def report(self) -> dict:
        """The GPU part of local mode's JSON report."""
        def peak(stats: PeakSummary, scale: float = 1.0) -> dict | None:
            if stats.p99 is None or stats.max is None:
                return None
            return {"p99": round(stats.p99 * scale, 2), "max": round(stats.max * scale, 2)}

        state = self.state()
        return {
            "telemetry": state.telemetry,
            "utilization_percent": peak(state.utilization, 100.0),
            "power_watts": peak(state.power),
            "target_utilization_percent": self.policy.gpu_peak_utilization_percent,
            "target_power_watts": self.policy.gpu_peak_power_watts,
            "floor_watts": self.floor_watts,
            "power_limit": self.explorer.report() if self.explorer else None,
            "error": self.error,
        }

    def close(self) -> None:
        """Restore every power limit this agent changed, then release the library."""
        self._restore_power_limits()
        self.backend.close()


class _LostBackend(NullGpuBackend):
    """What is left after the GPUs went away: no readings, the old name in /status."""

    def __init__(self, lost: GpuBackend) -> None:
        self.kind = lost.kind
        self.simulated = lost.simulated


def open_gpu_agent(backend: str, policy: Policy) -> GpuAgent:
    """The GPU agent both hosts run (the pod's sidecar, local mode): the backend named
    by `--gpu-backend` (gpu.open_backend; its note is the agent's `note`), and simulated
    GPUs made to see what the agent does to the workload. Raises GpuError."""
    from .gpu_simulate import follow

    opened, note = open_backend(backend)
    agent = GpuAgent(opened, policy, note=note)
    follow(agent)
    return agent
