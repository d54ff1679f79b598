"""Online choice between the two ways to hold a GPU power target: cap the board, or hold
the feeding process back.

Holding back (the duty of sidecar/gpu_controller.py) sheds dynamic power and throughput
in the same proportion. A power limit (NVML) makes the board lower its clocks until the
power fits; dynamic power falls faster than the clock (P ~ C V^2 f, the voltage following
the clock) and a kernel mix slows at most in proportion to the clock (less when it is
bound by memory), so a cap is usually much cheaper: published studies find about 60% of
TDP for a small slowdown on training. A board's governor can still do badly, and a
workload can be bound by something the clock does not touch, so which one is cheaper
for this workload is measured, as for the CPU levers (sidecar/cpu/explorer.py).

Two settings are enough. With the hold-back shedding whatever a cap above the target
leaves, throughput under a cap c is speed(c) x (T - idle) / (c - idle); where speed and
power follow power laws of the clock this is monotonic in c, so the best cap is at one
end: at the target (no hold-back needed) or none at all (hold-back only).

A cap above what the workload draws changes nothing, so the cap is the prior: it is in
force from the first interval, and a workload under the target is never touched. Once
the workload reports steps, the explorer measures steps per second under the cap, then
(if the cap binds) under the hold-back alone, with the duty controller holding the target
in both, and keeps the faster. Lifting the cap is the one risky move: the hold-back is
preset to what the uncapped setting last needed, or else the most the slowdown budget
allows, and then tracks the control law down to what is needed (`GpuController.track`:
from above, without overshoot); the probe counts an interval only once the hold-back has
settled. Uncapped, an interval over the target (in a probe, its
first interval included, or later when the workload changes) puts the cap back at once:
the hold-back alone cannot hold it within the slowdown budget.

    Waiting --an interval with steps and power--> Measuring(in force)
    Measuring(cap) --the board never says the cap binds--> Settled(cap)   (nothing to save)
    Measuring(s) --`samples` informative intervals--> Measuring(other) | Settled(best)
    any state, uncapped --an interval over the target--> Measuring(cap)   (at once)
    Settled(s) --a new phase (steps/s departs from its estimate, or a cap that did not
               bind now binds)--> Measuring(s)

The cap wins ties (within MIN_GAIN): it holds the target in hardware, at once, where
the hold-back clips a new peak one interval late.
"""

from __future__ import annotations

from dataclasses import dataclass

from .phase_gate import MIN_GAIN, PhaseGate

UNCAPPED = None   # the board's own power limit
# The hold-back counts as settled once it moves less than this in an interval, or after
# this many intervals of moving.
CONVERGED = 0.02
MAX_WAIT_INTERVALS = 4


@dataclass(frozen=True)
class GpuSample:
    """What one control interval saw: steps done, the busiest watched GPU's power, and
    the hold-back in force."""

    steps: float
    elapsed_seconds: float
    power_watts: float
    duty: float = 0.0
    # The board says its power cap holds its clocks down (NVML's SwPowerCap reason).
    capped: bool = False

    @property
    def informative(self) -> bool:
        return self.steps > 0 and self.elapsed_seconds > 0 and self.power_watts > 0

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.elapsed_seconds


class PowerLimitExplorer:
    """Chooses the power limit (`cap_watts` or UNCAPPED) that holds a power target at the
    most steps per second. `cap_watts` is where a cap meets the target: the controller's
    setpoint (the agent clamps it to each board's range)."""

    def __init__(self, target_watts: float, cap_watts: float, *, samples: int = 3,
                 settle: int = 1, phase_tolerance: float = 0.3, phase_intervals: int = 3) -> None:
        if target_watts <= 0 or cap_watts <= 0:
            raise ValueError(f"target and cap must be positive, got {target_watts}, {cap_watts}")
        if samples < 1 or settle < 0 or phase_tolerance <= 0 or phase_intervals < 1:
            raise ValueError("samples >= 1, settle >= 0, phase_tolerance > 0, "
                             "phase_intervals >= 1")
        self.target = target_watts
        self.cap = cap_watts
        self.samples = samples
        self.settle_intervals = settle
        self.phase_tolerance = phase_tolerance
        self.phases = PhaseGate(phase_intervals)
        self.limit: float | None = cap_watts   # in force: the prior
        self.state = "Waiting"
        # limit -> steps per second measured with the target held (0: cannot hold it)
        self.estimates: dict[float | None, float] = {}
        self.explorations = 0
        # The hold-back the uncapped setting needed when last measured (None: never).
        self.uncapped_duty: float | None = None
        self._last_duty = 0.0
        self._waited = 0
        self._slack = False    # settled on a cap that does not bind
        self._collected: list[GpuSample] = []
        self._settle = 0

    @property
    def probing(self) -> bool:
        """Measuring: the hold-back should track the control law both ways."""
        return self.state == "Measuring"

    def update(self, sample: GpuSample) -> float | None:
        """One control interval; returns the power limit to apply (UNCAPPED: none)."""
        if self.limit is UNCAPPED and sample.power_watts > self.target:
            self._fall_back()
        elif self.state == "Waiting":
            if sample.informative:   # not a sample: it holds the start-up
                self._explore()
        elif self.state == "Measuring":
            if self._settle > 0:
                self._settle -= 1
            elif sample.informative and self._converged(sample):
                self._collected.append(sample)
                if len(self._collected) >= self.samples:
                    self._finish()
        elif self._settle > 0:
            self._settle -= 1
        elif sample.informative and self.phases.observe(self._drifted(sample)):
            self._explore()
        self._last_duty = sample.duty
        return self.limit

    def _converged(self, sample: GpuSample) -> bool:
        """Uncapped, the hold-back tracks down from a safe height: count an interval only
        once it has settled (or has had time to: real readings wobble), or the probe would
        understate the hold-back alone."""
        if self.limit is not UNCAPPED or abs(sample.duty - self._last_duty) < CONVERGED:
            return True
        self._waited += 1
        return self._waited > MAX_WAIT_INTERVALS

    def _fall_back(self) -> None:
        """Uncapped and over the target: the hold-back alone does not hold it (in a probe,
        or after the workload changed), so the cap goes back at once and is measured."""
        self.estimates = {UNCAPPED: 0.0}
        self.uncapped_duty = None   # what it needed no longer holds the target
        self._switch(self.cap)
        self.state, self._collected = "Measuring", []

    def _explore(self) -> None:
        """Measure the setting in force first: no change, so no risk to the target."""
        self.explorations += 1
        self.estimates.clear()
        self.state, self._collected = "Measuring", []

    def _finish(self) -> None:
        got = self._collected
        self.estimates[self.limit] = (sum(s.steps for s in got)
                                      / sum(s.elapsed_seconds for s in got))
        if self.limit is UNCAPPED:
            self.uncapped_duty = got[-1].duty
        elif not any(s.capped for s in got):
            self._settle_on(self.limit, slack=True)   # under the target: nothing to save
            return
        other = UNCAPPED if self.limit is not UNCAPPED else self.cap
        if other not in self.estimates:
            self._switch(other)
            self._collected = []
            return
        capped, uncapped = self.estimates[self.cap], self.estimates[UNCAPPED]
        self._settle_on(self.cap if capped * (1 + MIN_GAIN) >= uncapped else UNCAPPED)

    def _settle_on(self, limit: float | None, slack: bool = False) -> None:
        self._switch(limit)
        self.state, self._slack = "Settled", slack
        self.phases.settled()

    def _switch(self, limit: float | None) -> None:
        if limit != self.limit:
            self.limit, self._settle, self._waited = limit, self.settle_intervals, 0

    def _drifted(self, sample: GpuSample) -> bool:
        if self._slack:
            return sample.capped
        expected = self.estimates.get(self.limit, 0.0)
        return abs(sample.steps_per_second / max(1e-12, expected) - 1) > self.phase_tolerance

    def report(self) -> dict:
        return {"state": self.state, "power_limit_watts": self.limit,
                "explorations": self.explorations,
                "steps_per_second": {("uncapped" if k is None else f"{k:g} W"): round(v, 3)
                                     for k, v in self.estimates.items()}}
