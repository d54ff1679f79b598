"""The GPU feedback controller: pure and deterministic (observations in, a duty out).

A GPU is throttled by holding back the process that feeds it: while the workload is
paused (paced by the runtime library or stopped by the signal enforcer) it launches no
kernels. So the controller's output is a duty: the fraction of wall time the workload
should be held back. Utilization and the power above the board's floor (what it draws
idle, which no hold-back removes) both scale roughly with (1 - duty), which gives a
multiplicative law:

    wanted = 1 - (1 - duty) * (setpoint - floor) / (measured - floor)

one step for utilization (floor 0) and for power once the agent has read the board
idle; until then the floor is taken as 0, the law under-corrects and repeats, converging
from above (never under the target for a wrong guess of the floor). Each target wants
its own duty and the largest wins, so no integrator winds up behind a target that is not
binding.

It attacks at once (a peak is clipped one interval after it starts), holds the duty for
`hold` intervals after the last sample near the setpoint, then releases slowly (a
reading just under the setpoint releases by the same slow step at once: a duty that
ratcheted up on a noisy reading settles back to the setpoint), so a
periodic load (a sawtooth) stays clipped rather than overshooting again each period,
while a workload whose peak has passed gets its speed back within a minute or so. It
never asks for more than the slowdown budget allows and reports when that is not enough.
Under target with no duty in force it does nothing. While `track` is set (a lever
probe, sidecar/gpu_explorer.py) the duty follows the law down as well as up at once: from
a duty that holds the target the law converges from above, so it never overshoots.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MARGIN = 0.03
# Per interval, the duty falls by at most this much once measurements are under setpoint.
DEFAULT_RELEASE = 0.02
# Measurements within this fraction under the setpoint hold the duty (no chatter).
HOLD_BAND = 0.05
DEFAULT_HOLD_INTERVALS = 10
# The actuator's gain: each interval moves the estimate this share of the way to the
# ratio just read, within GAIN_RANGE; read only where enough was asked to measure it.
GAIN_SMOOTHING = 0.5
GAIN_RANGE = (0.5, 2.0)
MIN_ASKED_FOR_GAIN = 0.05


@dataclass(frozen=True)
class GpuObservation:
    """The busiest watched GPU over one interval, and the hold-back actually in force."""

    utilization_ratio: float | None = None
    power_watts: float | None = None
    duty: float = 0.0
    # The least the board draws, read while it idled (0: not known yet).
    floor_watts: float = 0.0


@dataclass(frozen=True)
class GpuDecision:
    duty: float
    throttling: bool
    budget_exhausted: bool
    # "utilization", "power" or None: the target that set the duty.
    binding: str | None


class GpuController:
    def __init__(self, utilization_target_ratio: float | None = None,
                 power_target_watts: float | None = None, max_duty: float = 0.2,
                 margin: float = DEFAULT_MARGIN, release: float = DEFAULT_RELEASE,
                 hold: int = DEFAULT_HOLD_INTERVALS) -> None:
        for name, value in (("utilization target", utilization_target_ratio),
                            ("power target", power_target_watts)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if not 0 <= max_duty < 1 or not 0 <= margin < 0.5 or not 0 < release <= 1:
            raise ValueError("max_duty must be in [0, 1), margin in [0, 0.5), release in (0, 1]")
        self.targets = {"utilization": utilization_target_ratio, "power": power_target_watts}
        self.margin = margin
        self.max_duty = max_duty
        self.release = release
        self.hold = hold
        self.duty = 0.0        # the hold-back wanted (delivered)
        self.gain = 1.0        # delivered / asked, as measured
        self._asked = 0.0
        self.track = False
        self._quiet_intervals = 0

    @property
    def active(self) -> bool:
        return any(t is not None for t in self.targets.values())

    def update(self, obs: GpuObservation) -> GpuDecision:
        measured = {"utilization": obs.utilization_ratio, "power": obs.power_watts}
        in_force = min(0.99, max(0.0, obs.duty))
        self._learn_gain(in_force)
        wanted, binding, hold, over_target = 0.0, None, False, False
        over_setpoint = False
        for name, target in self.targets.items():
            m = measured[name]
            if target is None or m is None or m <= 0:
                continue
            setpoint = target * (1.0 - self.margin)
            floor = obs.floor_watts if name == "power" and obs.floor_watts < m else 0.0
            want = 1.0 - (1.0 - in_force) * max(0.0, setpoint - floor) / (m - floor)
            if want > wanted:
                wanted, binding = want, name
            hold = hold or m >= setpoint * (1.0 - HOLD_BAND)
            over_target = over_target or m > target
            over_setpoint = over_setpoint or m > setpoint
        self._quiet_intervals = 0 if hold else self._quiet_intervals + 1
        if wanted > self.duty or self.track:
            self.duty = wanted
        elif self._quiet_intervals > self.hold or (hold and not over_setpoint):
            # Past the hold, or settling just under the setpoint: release slowly.
            self.duty = max(wanted, self.duty - self.release)
        budget_exhausted = self.duty > self.max_duty and over_target
        self.duty = min(self.max_duty, max(0.0, self.duty))
        return GpuDecision(self.asked(), self.duty > 0.0, budget_exhausted,
                           binding if self.duty > 0.0 else None)

    def stand_down(self) -> None:
        """Nothing held back while the GPU is not read (its agent away): the next update
        starts from no hold-back, and does not learn the actuator's gain from a duty
        that was asked but never applied."""
        self.duty = self._asked = 0.0

    def asked(self) -> float:
        """The duty to ask of the actuator for the hold-back wanted."""
        self._asked = min(0.99, self.duty / self.gain) if self.duty > 0.0 else 0.0
        return self._asked

    def _learn_gain(self, delivered: float) -> None:
        if self._asked >= MIN_ASKED_FOR_GAIN:
            ratio = min(GAIN_RANGE[1], max(GAIN_RANGE[0], delivered / self._asked))
            self.gain += GAIN_SMOOTHING * (ratio - self.gain)
