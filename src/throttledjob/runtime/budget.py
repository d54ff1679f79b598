"""CPU-time token bucket: the one pacing rule behind every duty-cycle lever.

The runtime library pauses by sleeping at step boundaries; the sidecar pauses a process
tree with SIGSTOP. Both ask the same question: given the CPU seconds consumed so far,
how long must the work pause to stay within `rate_cores` on average?
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# No process tree can use more CPU in an interval than this many cores: CPU seconds
# beyond that were used before (a child found late) and are not charged.
CORES = os.cpu_count() or 1
# ... give or take one scheduler tick per core: the kernel adds a running thread's CPU
# time to its process's clock at ticks (10 ms at HZ=100) and context switches, so a
# reading a millisecond after the last may carry another thread's whole chunk. Capped at
# the interval alone, those chunks were dropped: a 2-thread torch loop paced to 1.76
# cores at 1.6 ms steps was never paused and ran at 1.99 (bench/zoo.py matmul).
CLOCK_TICK_SECONDS = 0.01


@dataclass
class CpuBudget:
    """Allow `rate_cores` of CPU on average, with a burst of `burst_seconds` at that rate.

    Any 1-second window then uses at most rate * (1 + burst_seconds) core-seconds, so a
    small burst keeps 1-second peaks within a few percent of the rate. Pauses are capped
    so that, over the whole run, paused time stays within `max_pause_fraction` of wall
    time: slowdown <= 1 / (1 - max_pause_fraction), whatever the workload does. The
    allowance accrues at the fraction in force at each reading (the sidecar lowers it
    once a lever's own cost is known).

    `max_pause_fraction` None holds the rate whatever it costs, off the budget's books:
    the sidecar's probe of a lever setting is measured under the target (its pauses
    still count in `paused_seconds`, which the slowdown estimate reads, but neither
    spend the allowance nor add to it).
    """

    rate_cores: float | None = None
    burst_seconds: float = 0.05
    # Debt smaller than this many seconds of pause is carried, not paused for at once:
    # one pause per few steps instead of one per step. Each pause costs more than its
    # length on a multi-threaded workload (idle OpenMP workers spin on for a while when
    # the main thread sleeps, and run cold when it wakes), so short steps paced one by
    # one lost over half their CPU to it (2-thread torch matmul at 1 ms steps).
    min_pause_seconds: float = 0.0
    max_pause_fraction: float | None = 0.0
    # When the work began (monotonic seconds): time run unpaused before the first
    # reading counts towards the slowdown budget. None: at the first reading.
    start_wall: float | None = None
    _tokens: float = 0.0
    _last_cpu: float | None = None
    _last_wall: float = 0.0
    paused_seconds: float = 0.0
    _allowance: float = 0.0         # pause seconds the budget has granted so far
    _charged: float = 0.0           # pause seconds spent against it
    _accrued_at: float | None = None
    # The last pause the bucket wanted was cut short by the slowdown budget. Kept until a
    # pause is granted in full: a reading that wants no pause (the bucket refilled while
    # the work was stopped a little longer than asked) says nothing about the budget.
    pause_capped: bool = False

    def set(self, rate_cores: float | None, max_pause_fraction: float | None) -> None:
        """Change the limits in place; the allowance and pauses so far keep counting."""
        self.rate_cores = rate_cores
        self.max_pause_fraction = max_pause_fraction

    def pause_for(self, cpu_seconds: float, now: float) -> float:
        """Seconds to pause now, given cumulative CPU seconds used and the wall clock."""
        self._accrue(now)
        if self._last_cpu is None:
            self._last_cpu, self._last_wall = cpu_seconds, now
            if self.start_wall is None:
                self.start_wall = now
            # Start empty: at a hand-over (runtime pacing -> the signal enforcer) the burst
            # was spent already, and a full bucket let 4-6% over the target through for
            # the first interval of every switch. The burst refills within 50 ms.
            self._tokens = 0.0
            return 0.0
        elapsed = max(0.0, now - self._last_wall)
        used = min(max(0.0, cpu_seconds - self._last_cpu),
                   (elapsed + CLOCK_TICK_SECONDS) * CORES)
        self._last_cpu, self._last_wall = cpu_seconds, now
        if not self.rate_cores:
            self._tokens = 0.0
            self.pause_capped = False
            return 0.0
        # Refill and use over the same interval, then cap: a step longer than the burst
        # earns its own tokens while it runs (capping first under-delivered coarse steps).
        # All of a step's CPU is charged: forgiving part of a long step's debt let steps
        # of 50 ms at a 0.15-core quota run at 0.2 cores, whatever the quota said.
        self._tokens = min(self._capacity(), self._tokens + elapsed * self.rate_cores - used)
        if self._tokens >= 0.0:
            return 0.0
        wanted = -self._tokens / self.rate_cores
        if wanted < self.min_pause_seconds:
            return 0.0
        if self.max_pause_fraction is None:  # a probe: hold the rate
            self.pause_capped = False
            return wanted
        allowed = max(0.0, self._allowance - self._charged)
        self.pause_capped = wanted > allowed
        if self.pause_capped:
            # What the slowdown budget refuses is forgiven, not carried: a backlog would
            # stall the work later, once the budget allows it.
            self._tokens = -allowed * self.rate_cores
        return min(wanted, allowed)

    def forget_baseline(self) -> None:
        """The next reading starts a new baseline (CPU used meanwhile is not charged)."""
        self._last_cpu = None

    def record_pause(self, seconds: float) -> None:
        """Account for time actually spent paused (it may differ from what was asked)."""
        self.paused_seconds += max(0.0, seconds)
        if self.max_pause_fraction is not None:
            self._charged += max(0.0, seconds)

    def _accrue(self, now: float) -> None:
        """Grant the allowance for the time since the last reading (from the start of the
        work at the first), at the fraction in force; none while probing."""
        if self._accrued_at is None:
            self._accrued_at = now if self.start_wall is None else self.start_wall
        if self.max_pause_fraction is not None:
            self._allowance += self.max_pause_fraction * max(0.0, now - self._accrued_at)
        self._accrued_at = max(self._accrued_at, now)

    def _capacity(self) -> float:
        return (self.rate_cores or 0.0) * self.burst_seconds
