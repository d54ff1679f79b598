"""The cooperative levers: one setting of them (threads, batch scale, pacing), what one
control interval saw of the workload under it, what a setting was measured to do, and
the settings worth probing on a machine (explorer.py measures them online).

The model. Under lever setting `s` the workload does `efficiency(s)` steps per CPU-second
and, unpaused, wants `peak(s)` cores at its busy times. The rate (kept in force by the
controller whatever the levers) clips what is left above the target T, so under `s` the
busy-time throughput is

    throughput(s) = efficiency(s) * min(peak(s), T)          (steps per second)

and the best setting is the one that maximises it. Idle time (waits, I/O) is the same
under every setting, so ranking by busy-time throughput ranks by run time too. Both
figures are measured *while the rate is on*: duty cycling scales CPU and steps alike,
so steps per CPU-second does not depend on it (save the CPU a kernel quota makes
synchronised threads waste, docs/dev/benchmarks.md), and the unpaused demand is the width
the kernel measured where its quota held the tree back, else the measured usage divided
by the fraction of the interval not paused. Probing therefore never lifts the rate: the
peak target holds during exploration too.

Pure: dataclasses and functions of numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..phase_gate import MIN_GAIN

# Below this usage (cores) an interval tells nothing about the levers (idle wait).
IDLE_CORES = 0.05
# Demand, where no kernel measured the width, is usage / (1 - pause); past this pause
# fraction that estimate is too noisy.
MAX_PAUSE_FOR_DEMAND = 0.9
# Paused for at least this fraction of an interval, the workload wanted more than the
# rate at its busy moments, whatever its interval-averaged demand says.
PACED = 0.05


class Pacing(str, Enum):
    """How the rate's duty cycle is delivered (see LeverSetting)."""

    SLEEP = "sleep"
    STOP = "stop"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class LeverSetting:
    """One setting of the cooperative levers (None / 1.0 / sleep: the defaults). A lever
    is one knob (threads, batch scale, pacing); this is a value for each.

    `pacing` is how the rate's duty cycle is delivered: "sleep", by the runtime at step
    boundaries, or "stop", by the sidecar's SIGSTOP of the whole tree. Sleeping one
    thread leaves a multi-threaded workload's other threads running (idle OpenMP
    workers spin on for milliseconds, burning their share), which stopping does not.
    """

    threads: int | None = None
    batch_scale: float = 1.0
    pacing: Pacing = Pacing.SLEEP

    def __str__(self) -> str:
        parts = [f"threads={self.threads or 'default'}"]
        if self.batch_scale != 1.0:
            parts.append(f"batch_scale={self.batch_scale:g}")
        if self.pacing != Pacing.SLEEP:
            parts.append(f"pacing={self.pacing}")
        return ",".join(parts)


DEFAULT_SETTING = LeverSetting()


@dataclass(frozen=True)
class LeverSample:
    """What one control interval saw of the workload."""

    usage_cores: float          # CPU of the whole tree over the interval, in cores
    pause_fraction: float       # fraction of the interval paused by duty cycling
    steps: float                # steps the workload completed in the interval
    elapsed_seconds: float = 1.0
    # The CPUs the workload may use: no demand is more. Read through a deep pause, the
    # demand of a 2-thread loop on 2 cores read 2.42, and R0 with it (every lever's cost).
    cores: float = float("inf")
    # Cores the workload wanted at its busy moments, as the kernel's quota measured them
    # (None: not measured). A partly idle interval (a burst, then a wait) averages its
    # usage down: a 2-thread burst held to 1 core read a demand of 1.4, and the defaults'
    # unthrottled rate (every lever's cost) with it.
    busy_width: float | None = None

    @property
    def informative(self) -> bool:
        """Busy and making progress: the interval says something about the levers."""
        return self.steps > 0 and self.usage_cores > IDLE_CORES and self.elapsed_seconds > 0

    @property
    def demand_cores(self) -> float:
        """The usage the workload would have had unpaused at its busy moments."""
        if self.busy_width is not None:
            return min(self.cores, self.busy_width)
        return min(self.cores,
                   self.usage_cores / (1.0 - min(self.pause_fraction, MAX_PAUSE_FOR_DEMAND)))

    @property
    def efficiency(self) -> float:
        """Steps per CPU-second (independent of duty cycling)."""
        return self.steps / max(1e-9, self.usage_cores * self.elapsed_seconds)

    @property
    def paced(self) -> bool:
        return self.pause_fraction >= PACED

    def wants(self, target_cores: float) -> bool:
        return wants_target(self.demand_cores, self.paced, target_cores)


def wants_target(demand_cores: float, paced: bool, target_cores: float) -> bool:
    """The workload wants the target or more at its busy times: its demand reaches it
    (within MIN_GAIN: under fewer threads it is all that shows), or the rate held it
    back. An interval partly idle (a bursty workload) averages its demand down, so the
    pause is the better witness there."""
    return paced or demand_cores * (1 + MIN_GAIN) >= target_cores


@dataclass(frozen=True)
class Estimate:
    """What was measured under one lever setting."""

    levers: LeverSetting
    efficiency: float            # steps per CPU-second
    peak_cores: float            # unpaused demand at busy times (max over the samples)
    samples: int
    aborted: bool = False        # probe cut short: clearly worse than the best so far
    paced: bool = False          # the rate held it back in some sample

    def throughput(self, target_cores: float) -> float:
        """Busy-time steps per second under this setting with the rate at the target."""
        return self.efficiency * min(self.peak_cores, target_cores)

    @property
    def unthrottled_rate(self) -> float:
        """Busy-time steps per second under this setting unheld."""
        return self.efficiency * self.peak_cores

    def wants(self, target_cores: float) -> bool:
        return wants_target(self.peak_cores, self.paced, target_cores)

    @staticmethod
    def of(levers: LeverSetting, samples: list[LeverSample], aborted: bool = False) -> Estimate:
        cpu = sum(s.usage_cores * s.elapsed_seconds for s in samples)
        steps = sum(s.steps for s in samples)
        return Estimate(levers, steps / max(1e-9, cpu),
                        max(s.demand_cores for s in samples), len(samples), aborted,
                        any(s.paced for s in samples))


# k threads use at most k cores: capped under a target T they can win only if each core
# does T/k times the work it does at the defaults. The most measured here is 1.33x (one
# thread of examples/torch_train.py against two, per CPU-second); a probe needing more
# than this costs an interval at a fraction of the speed and is never kept (at 90% of a
# 2-core peak, one thread's probes cost 3-10% of the run: docs/dev/benchmarks.md).
MAX_PER_CORE_GAIN = 1.5


def thread_candidates(cores: int, target_cores: float) -> list[LeverSetting]:
    """Thread counts worth probing on `cores` CPUs for a target: halvings of the core
    count and the counts next to the target, most threads first (1 on a 2-core box),
    leaving out those too few to win at the target (MAX_PER_CORE_GAIN)."""
    counts = set()
    n = cores // 2
    while n >= 1:
        counts.add(n)
        n //= 2
    for near in (int(target_cores), int(target_cores) + 1):
        counts.add(near)
    return [LeverSetting(threads=t) for t in sorted(counts, reverse=True)
            if 1 <= t < cores and t * MAX_PER_CORE_GAIN >= target_cores]


def probe_order(cores: int, target_cores: float, stop_pacing: bool) -> list[LeverSetting]:
    """The candidates, most promising first, for a workload nothing is known about.

    If threads scaled perfectly, `threads=k` would run as fast as the defaults under a
    target of k cores or less (it needs no duty cycling), and any parallel overhead makes
    it faster: those come first. Pacing by stop (when the sidecar may stop the tree) can
    only win back what sleeping wastes, and thread counts under the target lose k/T of
    the speed unless the workload scales badly: those follow. Probing the likely winner
    first lets the later, clearly worse probes be cut short after one sample.
    """
    threads = thread_candidates(cores, target_cores)
    first = [c for c in threads if c.threads >= target_cores]
    rest = [c for c in threads if c.threads < target_cores]
    return first + ([LeverSetting(pacing=Pacing.STOP)] if stop_pacing else []) + rest


def more_threads(candidate: LeverSetting, measured: LeverSetting) -> bool:
    """`candidate` differs from `measured` only by more threads (default: the most). A
    change of pacing counts too when `measured` has one thread: pacing one thread by
    sleeping wastes nothing that stopping would save."""
    def count(levers: LeverSetting) -> float:
        return float("inf") if levers.threads is None else levers.threads
    return (candidate.batch_scale == measured.batch_scale
            and (candidate.pacing == measured.pacing or measured.threads == 1)
            and count(candidate) > count(measured))


def fewer_threads(candidate: LeverSetting, loser: LeverSetting) -> bool:
    return (loser.threads is not None and candidate.threads is not None
            and (candidate.batch_scale, candidate.pacing) == (loser.batch_scale, loser.pacing)
            and candidate.threads < loser.threads)
