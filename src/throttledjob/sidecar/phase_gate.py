"""What both lever explorers (cpu/explorer.py, gpu_explorer.py) take for noise: a gain
too small to leave a setting for, and drift too short to be a new phase worth exploring
again (their Settled states ask). One rule for both halves, so neither imports the
other."""

from __future__ import annotations

from dataclasses import dataclass

# A setting counts as better than the one in force only if it wins by this much: noise
# must not move a workload off its own defaults (or a board off its cap).
MIN_GAIN = 0.03


@dataclass
class PhaseGate:
    """When drift from a settled estimate is a new phase, worth exploring again.

    `intervals` drifting intervals in a row prove a new phase. Each new exploration in a
    row needs twice the evidence (a workload, or a machine shared with noisy neighbours,
    whose speed swings by more than the tolerance all the time must not be re-probed over
    and over) until `calm` intervals in a row pass without drift. Intervals that say
    nothing (idle, no steps) are not observed: they neither count nor reset.
    """

    intervals: int = 3
    calm: int = 30
    drift: int = 0
    steady: int = 0
    recent: int = 0      # explorations since the last long calm

    def settled(self) -> None:
        self.drift = self.steady = 0

    def observe(self, drifted: bool) -> bool:
        """One informative interval; True when it proves a new phase."""
        self.drift = self.drift + 1 if drifted else 0
        self.steady = 0 if drifted else self.steady + 1
        if self.steady >= self.calm:  # a long calm: phases are real again
            self.recent = 0
        if self.drift < self.intervals * 2 ** min(5, self.recent):
            return False
        self.recent += 1
        self.drift = 0
        return True
