"""The CPU feedback controller: pure and deterministic (observations in, decisions out).

The actuators (the runtime's pacing, the sidecar's SIGSTOP/SIGCONT) are token buckets
on CPU time (throttledjob.runtime.budget), so a rate is in force from the first
instant: a workload under its target is never touched, and a burst is clipped at once
instead of one control interval later. This controller trims that rate so the usage
*measured* over the whole process tree sits just under the target (the actuators see
only part of it: worker processes that do not cooperate, children spawned between
scans), and reports when the slowdown budget, enforced inside the actuators, stops it
from reaching the target.
"""

from __future__ import annotations

from dataclasses import dataclass

# The rate aims this far under the target so that the 99th percentile, not only the
# mean, of 1-second samples stays at or under it.
DEFAULT_MARGIN = 0.02
# Pausing less than this fraction of an interval counts as "not throttling".
BINDING_PAUSE_FRACTION = 0.01
MAX_STEP = 0.1


@dataclass(frozen=True)
class CpuObservation:
    """What one control interval saw."""

    usage_cores: float
    # Fraction of the interval the workload spent paused by an actuator.
    pause_fraction: float = 0.0
    # True when an actuator wanted to pause more but the slowdown budget forbade it.
    pause_capped: bool = False
    # Only cooperative pacing can hold usage below the rate by a bias of its own (equal
    # shares among peers that use them unequally); the signal enforcer counts exactly
    # what is measured. Without that bias, usage under the setpoint while pausing means
    # an interval that was partly idle (a burst ending), never a reason to raise the rate.
    may_under_deliver: bool = True


@dataclass(frozen=True)
class CpuDecision:
    rate_cores: float
    throttling: bool
    # The target cannot be met within maxSlowdown: the budget is holding the actuators back.
    budget_exhausted: bool


class CpuController:
    """Integral trim of a CPU rate (cores) for one CPU peak target.

    "Rate", not "quota": the word quota is kept for the kernel's CFS quota."""

    def __init__(self, target_cores: float, adaptive: bool = True,
                 margin: float = DEFAULT_MARGIN, gain: float = 0.5) -> None:
        if target_cores <= 0:
            raise ValueError(f"target must be positive, got {target_cores}")
        if not 0 <= margin < 0.5 or not 0 < gain <= 1:
            raise ValueError("margin must be in [0, 0.5) and gain in (0, 1]")
        self.target = target_cores
        self.setpoint = target_cores * (1.0 - margin)
        self.adaptive = adaptive
        self.gain = gain
        self.rate = self.setpoint
        # Anti-windup bounds: the trim corrects measurement gaps, it never runs away.
        self._low = 0.1 * self.setpoint
        self._high = 1.5 * self.setpoint

    def restart(self) -> float:
        """Forget the trim: it corrected one actuator's bias (cooperative pacing delivers
        less than its rate when peers use their shares unequally), and the next one, the
        signal enforcer, delivers its rate exactly: the trim carried over overshot the
        target by 4% for an interval at each hand-over."""
        self.rate = self.setpoint
        return self.rate

    def update(self, obs: CpuObservation) -> CpuDecision:
        binding = obs.pause_fraction > BINDING_PAUSE_FRACTION
        over = obs.usage_cores > self.setpoint
        budget_exhausted = obs.pause_capped and obs.usage_cores > self.target
        # Integrate only while an actuator is acting or usage escapes it; an idle or
        # light workload must not wind the rate up (it would then burst past target),
        # and a capped actuator must not wind it down (it cannot pause more anyway).
        if self.adaptive and (binding or over) and not obs.pause_capped:
            # One odd interval (a start-up burst, a child found late) moves the rate by
            # at most MAX_STEP of the setpoint; a real bias is still gone in a few steps.
            # Raising the rate is the risky direction (usage held low by something else,
            # a neighbour's load, an idle peer, lets it climb, and the next burst uses it
            # all): up-moves are half as fast as down-moves and stop at 1.5x the setpoint.
            step = self.gain * (self.setpoint - obs.usage_cores)
            limit = MAX_STEP * self.setpoint
            if step > 0:
                if not obs.may_under_deliver:
                    step = 0.0
                step, limit = step / 2, limit / 2
            self.rate += min(limit, max(-limit, step))
            self.rate = min(self._high, max(self._low, self.rate))
        return CpuDecision(self.rate, binding or over, budget_exhausted)
