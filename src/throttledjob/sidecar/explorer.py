"""Online lever exploration: find, per workload, the cooperative levers that cost least.

Duty cycling (a CPU rate, held by the kernel's quota, signals or pacing) cuts a peak at
a slowdown in proportion: a workload that wants D cores, held to T, runs at T/D of its
speed. Other levers are cheaper on some
workloads: fewer threads on one that scales poorly with threads (a memory-bound
elementwise loop loses little speed but half its cores from 2 threads to 1) or a smaller
micro-batch. They cost *more* on others (a matmul-bound loop loses speed in proportion to
threads, no better than duty cycling). Which is which can only be measured, so this unit
measures it online, as Zeus's power-limit optimizer does for GPU power limits.

The model. Under lever setting `s` the workload does `efficiency(s)` steps per CPU-second
and, unpaused, wants `peak(s)` cores at its busy times. The rate (kept in force by the
controller whatever the levers) clips what is left above the target T, so under `s` the
busy-time throughput is

    throughput(s) = efficiency(s) * min(peak(s), T)          (steps per second)

and the best setting is the one that maximises it. Idle time (waits, I/O) is the same
under every setting, so ranking by busy-time throughput ranks by run time too. Both
figures are measured *while the rate is on*: duty cycling scales CPU and steps alike,
so steps per CPU-second does not depend on it (save the CPU a kernel quota makes
synchronised threads waste, docs/benchmarks.md), and the unpaused demand is the width
the kernel measured where its quota held the tree back, else the measured usage divided
by the fraction of the interval not paused. Probing therefore never lifts the rate: the
peak target holds during exploration too.

The slowdown budget. With `max_slowdown` B, the rate is lifted wherever holding the
target would slow the workload by more than B, so a setting is ranked by its throughput
under the rate it would really get: `max(T, R0 / (B * efficiency(s)))`, where R0 is the
unthrottled rate (the defaults' efficiency times their demand). A setting that costs
speed by itself (one thread of two on a compute-bound loop) then loses to the defaults
wherever the budget binds: it would be duty-cycled to the same lifted rate at fewer
steps per CPU-second. To know R0 the defaults are always measured when there is a budget.
Where the budget lifts the defaults past what any thread count can reach, probing is
pure cost (its probes hold the target): the explorer waits until the run has lasted long
enough to repay it (`worth_exploring`), which on a short run is never.
`lever_slowdown()` is what the levers in force cost by themselves, R0 over their own
unthrottled rate: the agent charges it against the budget before any pause.

The state machine (one `update()` per control interval, observations in, levers out;
pure and deterministic, so it is tested on synthetic workloads):

    Waiting --steps advance, and the exploration pays--> Measuring(reference)
    Measuring(s) --enough samples--> Measuring(next candidate) | Settled(best)
    Measuring(probe) --first sample clearly worse than the best--> next (probe aborted;
                      never the defaults': they are the yardstick of every cost)
    Settled --workload drifts (phase change) for a few intervals--> Measuring(reference)

The reference, measured first, is the defaults, unless the workload wants more than the
target and a thread count at or over the target exists: then the fewest such threads
(`threads=1` for any target up to one core). A prior prunes what cannot win. If more
threads never make a workload faster per thread (no superlinear scaling), then at or
over the target every extra thread only adds duty cycling: a setting with more threads
than one measured at the target does fewer steps per CPU-second under the same rate, so
it is never probed. Fewer threads than a count that lost are not probed either.

Each state is a dataclass below; its docstring gives its transitions.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from enum import Enum

# A lever setting counts as better than the defaults only if it wins by this much: noise
# must not move a workload off its own defaults.
MIN_GAIN = 0.03
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
        return _wants(self.demand_cores, self.paced, target_cores)


def _wants(demand_cores: float, paced: bool, target_cores: float) -> bool:
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
        return _wants(self.peak_cores, self.paced, target_cores)

    @staticmethod
    def of(levers: LeverSetting, samples: list[LeverSample], aborted: bool = False) -> Estimate:
        cpu = sum(s.usage_cores * s.elapsed_seconds for s in samples)
        steps = sum(s.steps for s in samples)
        return Estimate(levers, steps / max(1e-9, cpu),
                        max(s.demand_cores for s in samples), len(samples), aborted,
                        any(s.paced for s in samples))


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


# ---- states -------------------------------------------------------------------------

@dataclass
class Waiting:
    """No step seen yet (start-up, imports), or no lever can win: the defaults apply.

    -> Measuring(reference) after the first informative interval (not counted: start-up)
       where the exploration pays for itself (`worth_exploring`: what its probes, held at
       the target, cost against the budget's lift, `exploration_cost`, repaid over the
       time the run is expected to last still by the most a lever can save,
       `lever_gain_bound`); else the defaults stay, under the budget, nothing probed,
       until the run has lasted long enough. Where the verdict hangs on the demand, it
       is read past the first informative interval (start-up lowers it).
    """

    levers: LeverSetting = DEFAULT_SETTING
    informative: int = 0      # informative intervals seen
    seconds: float = 0.0      # and their length
    peak: float = 0.0         # the most demand read past the first (cores)


@dataclass
class Measuring:
    """Applying `levers` and collecting samples; the first `settle` intervals after the
    change are discarded (the runtime picks settings up within a fraction of a second).

    -> Measuring(next candidate) after `needed` informative samples, or after one sample
       when it is clearly worse than the best so far (the probe is aborted: a bad probe
       costs at most settle + 1 intervals);
    -> Settled(best) when no candidate is left (or none can win), or at once after the
       defaults when the workload's peak is already under the target (nothing to save).
    """

    levers: LeverSetting
    needed: int
    settle: int
    samples: list[LeverSample] = field(default_factory=list)


@dataclass
class Settled:
    """The best setting is applied; each interval is compared with its estimate.

    -> Measuring(reference) after `phase_intervals` (doubling with each re-exploration
       until `calm_intervals` pass without drift) consecutive informative intervals whose
       efficiency or demand departs from the estimate by more than `phase_tolerance`
       (a phase change), or whose demand crosses the target when it was settled under it;
       idle or step-less intervals neither count nor reset.
    """

    levers: LeverSetting
    estimate: Estimate
    settle: int = 1


State = Waiting | Measuring | Settled


@dataclass(frozen=True)
class Decision:
    levers: LeverSetting
    state: str
    # Busy-time slowdown the model predicts for `levers` against the unthrottled defaults.
    predicted_slowdown: float | None = None


class Explorer:
    """Chooses the cooperative levers that meet a CPU target at the least slowdown.

    `candidates` are the non-default settings to probe, in order (`probe_order`). Along
    the thread axis probing stops at the first candidate that loses to the best so far
    (fewer threads do not help a workload that already lost speed faster than cores at a
    higher count), and skips counts above one that already reached the target.
    """

    def __init__(self, target_cores: float, candidates: list[LeverSetting], *,
                 baseline_intervals: int = 2, probe_intervals: int = 2, settle_intervals: int = 1,
                 abort_below: float = 0.8, phase_tolerance: float = 0.3,
                 phase_intervals: int = 3, max_slowdown: float | None = None) -> None:
        if target_cores <= 0:
            raise ValueError(f"target must be positive, got {target_cores}")
        if baseline_intervals < 1 or probe_intervals < 1 or settle_intervals < 0:
            raise ValueError("baseline and probe need at least one interval, settle >= 0")
        if not 0 < abort_below <= 1 or phase_tolerance <= 0 or phase_intervals < 1:
            raise ValueError("abort_below in (0, 1], phase_tolerance > 0, phase_intervals >= 1")
        if DEFAULT_SETTING in candidates or len(set(candidates)) != len(candidates):
            raise ValueError("candidates must be distinct and exclude the defaults")
        if max_slowdown is not None and max_slowdown < 1:
            raise ValueError(f"max_slowdown must be at least 1, got {max_slowdown}")
        self.target = target_cores
        self.max_slowdown = max_slowdown
        self.candidates = list(candidates)
        self.baseline_intervals = baseline_intervals
        self.probe_intervals = probe_intervals
        self.settle_intervals = settle_intervals
        self.abort_below = abort_below
        self.phase_tolerance = phase_tolerance
        self.state: State = Waiting()
        self.estimates: dict[LeverSetting, Estimate] = {}
        self._queue: list[LeverSetting] = []
        self.reference: LeverSetting = DEFAULT_SETTING   # measured first in this exploration
        self.explorations = 0
        self.phases = PhaseGate(phase_intervals)
        self.history: list[tuple[str, LeverSetting]] = []   # (state name, levers) per transition
        # The last intervals seen, for reports: (levers in force, sample).
        self.trace: collections.deque[tuple[LeverSetting, LeverSample]] = \
            collections.deque(maxlen=120)

    @property
    def levers(self) -> LeverSetting:
        return self.state.levers

    @property
    def measuring(self) -> bool:
        """A setting is being measured (the agent holds the target meanwhile)."""
        return isinstance(self.state, Measuring)

    def set_target(self, target_cores: float) -> None:
        """A new target re-ranks what was measured (no re-probing), unless it starts from
        another reference, which was not measured."""
        if target_cores <= 0:
            raise ValueError(f"target must be positive, got {target_cores}")
        self.target = target_cores
        if isinstance(self.state, Settled) and self.estimates:
            wants = any(e.wants(target_cores) for e in self.estimates.values())
            if self._reference_for(wants) == self.reference:
                self._settle()
            else:  # what was measured is not what this target starts from
                self.estimates.clear()
                self._explore(wants, current=self.levers)

    def update(self, sample: LeverSample) -> Decision:
        s = self.state
        self.trace.append((s.levers, sample))
        if isinstance(s, Waiting):
            if sample.informative:
                # Not a sample: it holds the start-up (imports, warm-up) as well as the
                # first steps, and would understate the defaults' steps per CPU-second.
                s.informative += 1
                s.seconds += sample.elapsed_seconds
                if s.informative > 1:
                    # The most, as a setting's peak (Estimate.of): a run's last interval
                    # read 1.37 cores of the 1.5-1.9 before it, and set a probe going.
                    s.peak = max(s.peak, sample.demand_cores)
                # The first interval's demand is lowered by start-up: it decides only
                # where even the most demand there can be (all the cores) would.
                if self._worth(s.seconds, sample.elapsed_seconds, sample.cores) or (
                        s.informative > 1
                        and self._worth(s.seconds, sample.elapsed_seconds, s.peak)):
                    self._explore(sample.wants(self.target), current=DEFAULT_SETTING)
        elif isinstance(s, Measuring):
            if s.settle > 0:
                s.settle -= 1
            else:
                self._collect(sample)
        else:
            self._watch(s, sample)
        return self.decision()

    def decision(self) -> Decision:
        predicted = None   # known only when the defaults were measured
        unthrottled = self.unthrottled_rate()
        chosen = self.estimates.get(self.levers)
        if isinstance(self.state, Settled) and unthrottled and chosen:
            predicted = round(unthrottled / max(1e-12, self._throughput(chosen)), 3)
        return Decision(self.levers, type(self.state).__name__, predicted)

    def unthrottled_rate(self) -> float | None:
        """R0: busy-time steps per second of the defaults unheld; None until the
        defaults were measured."""
        base = self.estimates.get(DEFAULT_SETTING)
        return base.unthrottled_rate if base else None

    def unthrottled_rate_high(self) -> float | None:
        """The most R0 can be. Measured while the rate held the defaults back, R0 reads
        low where synchronised threads waste CPU at the hold's edges (one spins at a
        barrier while a sibling is throttled: 3-9% of a PyTorch loop's speed at the
        quota's period, docs/benchmarks.md). Unheld, the defaults do no more steps per
        CPU-second than fewer threads do (no superlinear scaling, as the probe order
        assumes), so a thread cap measured with no such waste (one thread, which has no
        sibling, or any cap unheld) bounds it at the defaults' demand. That bound also
        takes in the loop's own loss to a second thread, which the held measurement
        cannot tell from the waste: it is wide where fewer threads win. With no such
        witness it says what R0 says; measured unheld, R0 is as read."""
        base = self.estimates.get(DEFAULT_SETTING)
        if base is None:
            return None
        if not base.paced:
            return base.unthrottled_rate
        witnesses = [e.efficiency for levers, e in self.estimates.items()
                     if levers.threads is not None and levers.batch_scale == 1.0
                     and (levers.threads == 1 or not e.paced)]
        return base.peak_cores * max([base.efficiency, *witnesses])

    def lever_slowdown(self, levers: LeverSetting | None = None,
                       most: bool = False) -> float | None:
        """What `levers` (default: those in force) cost by themselves (1 or more): R0 over
        their own unthrottled rate, or with `most` the most they can cost (R0 at its
        most: the defaults too may cost more than 1 then); None where either was not
        measured."""
        unthrottled = self.unthrottled_rate_high() if most else self.unthrottled_rate()
        current = self.estimates.get(self.levers if levers is None else levers)
        if not unthrottled or current is None:
            return None
        return max(1.0, unthrottled / max(1e-12, current.unthrottled_rate))

    def rate_for(self, estimate: Estimate) -> float:
        """The rate `estimate`'s setting would get: the target, lifted where holding it
        would pass the slowdown budget (module doc)."""
        unthrottled = self.unthrottled_rate()
        if self.max_slowdown is None or not unthrottled:
            return self.target
        return max(self.target,
                   unthrottled / (self.max_slowdown * max(1e-12, estimate.efficiency)))

    @property
    def exploration_intervals(self) -> int:
        """The most intervals an exploration lasts: the reference (its settle and
        baseline), every other setting (the defaults included) probed in full, and the
        settle into the winner."""
        return (self.settle_intervals + self.baseline_intervals
                + len(self.candidates) * (self.settle_intervals + self.probe_intervals)
                + self.settle_intervals)

    def _worth(self, seconds: float, interval: float, demand_cores: float) -> bool:
        cost = exploration_cost(self.exploration_intervals * interval, demand_cores,
                                self.target, self.max_slowdown)
        gain = lever_gain_bound(self.candidates, demand_cores, self.target, self.max_slowdown)
        return worth_exploring(seconds, cost, gain)

    def _throughput(self, estimate: Estimate) -> float:
        return estimate.throughput(self.rate_for(estimate))

    # ---- transitions ----------------------------------------------------------------

    def _collect(self, sample: LeverSample) -> None:
        s = self.state
        assert isinstance(s, Measuring)
        if not sample.informative:
            return
        s.samples.append(sample)
        # The defaults are never cut short: R0, every lever's cost and the slowdown
        # estimate are read from them, and their first interval after a change of threads
        # runs slow (cut there, the report read 10-20% low on three 2-thread loops).
        if (s.levers not in (self.reference, DEFAULT_SETTING)
                and len(s.samples) == 1 and len(s.samples) < s.needed):
            trial = Estimate.of(s.levers, s.samples)
            if self._throughput(trial) < self.abort_below * self._best_throughput():
                self._finish(Estimate.of(s.levers, s.samples, aborted=True))
                return
        if len(s.samples) >= s.needed:
            self._finish(Estimate.of(s.levers, s.samples))

    def _finish(self, estimate: Estimate) -> None:
        best_before = self._best_throughput()
        self.estimates[estimate.levers] = estimate
        if estimate.levers == self.reference:
            # Nothing to save when the workload is already under the target.
            nothing = (estimate.levers == DEFAULT_SETTING and not estimate.paced
                       and estimate.peak_cores <= self.target)
            self._queue = [] if nothing else [c for c in [DEFAULT_SETTING, *self.candidates]
                                              if c != self.reference]
        elif self._throughput(estimate) < best_before:
            # Fewer threads than a losing count will not win either: skip them.
            self._queue = [c for c in self._queue if not _fewer_threads(c, estimate.levers)]
        self._queue = [c for c in self._queue if not self._dominated(c)]
        if self._queue:
            self._measure(self._queue.pop(0), self.probe_intervals, self.settle_intervals)
        else:
            self._settle()

    def _dominated(self, candidate: LeverSetting) -> bool:
        """More threads than a setting measured at the target: they would be duty-cycled
        to the same cores at fewer steps per CPU-second (the prior in the module doc).
        Wanting the target (`_wants`) counts as at it: no more than that is left to win.
        Under a slowdown budget the defaults are never dominated: R0 is theirs."""
        if self.max_slowdown is not None and candidate == DEFAULT_SETTING:
            return False
        return any(_more_threads(candidate, e.levers) and e.wants(self.target)
                   for e in self.estimates.values())

    def _settle(self) -> None:
        base = self.estimates[self.reference]
        best = max(self.estimates.values(), key=self._throughput)
        if self._throughput(best) < (1 + MIN_GAIN) * self._throughput(base):
            best = base
        settle = self.settle_intervals if best.levers != self.levers else 0
        self.state = Settled(best.levers, best, settle=settle)
        self.phases.settled()
        self.history.append(("Settled", best.levers))

    def _measure(self, levers: LeverSetting, needed: int, settle: int) -> None:
        self.state = Measuring(levers, needed, settle)
        self.history.append(("Measuring", levers))

    def _watch(self, s: Settled, sample: LeverSample) -> None:
        if s.settle > 0:
            s.settle -= 1
            return
        if not sample.informative:
            return
        e = s.estimate
        tol = self.phase_tolerance
        demand = sample.demand_cores
        drifted = (abs(sample.efficiency / max(1e-12, e.efficiency) - 1) > tol
                   or demand > e.peak_cores * (1 + tol)
                   # settled as "under target", and now over it
                   or e.peak_cores <= self.target < demand / (1 + MIN_GAIN))
        if self.phases.observe(drifted):
            # A new phase: forget the old model and measure again from the reference.
            self.estimates.clear()
            self._explore(sample.wants(self.target), current=s.levers)

    def _explore(self, wants_target: bool, current: LeverSetting) -> None:
        """Start an exploration: measure the reference first (module doc)."""
        self.explorations += 1
        self.reference = self._reference_for(wants_target)
        settle = self.settle_intervals if self.reference != current else 0
        self._measure(self.reference, self.baseline_intervals, settle)

    def _reference_for(self, wants_target: bool) -> LeverSetting:
        """The defaults, or the fewest threads at or over the target when the workload
        wants the target (they dominate every count above: module doc)."""
        at_target = [c for c in self.candidates if c.threads is not None
                     and c.threads >= self.target and c == LeverSetting(threads=c.threads)]
        if wants_target and at_target:
            return min(at_target, key=lambda c: c.threads)
        return DEFAULT_SETTING

    def _best_throughput(self) -> float:
        return max((self._throughput(e) for e in self.estimates.values()), default=0.0)


def _more_threads(candidate: LeverSetting, measured: LeverSetting) -> bool:
    """`candidate` differs from `measured` only by more threads (default: the most). A
    change of pacing counts too when `measured` has one thread: pacing one thread by
    sleeping wastes nothing that stopping would save."""
    def count(levers: LeverSetting) -> float:
        return float("inf") if levers.threads is None else levers.threads
    return (candidate.batch_scale == measured.batch_scale
            and (candidate.pacing == measured.pacing or measured.threads == 1)
            and count(candidate) > count(measured))


def _fewer_threads(candidate: LeverSetting, loser: LeverSetting) -> bool:
    return (loser.threads is not None and candidate.threads is not None
            and (candidate.batch_scale, candidate.pacing) == (loser.batch_scale, loser.pacing)
            and candidate.threads < loser.threads)


# k threads use at most k cores: capped under a target T they can win only if each core
# does T/k times the work it does at the defaults. The most measured here is 1.33x (one
# thread of examples/torch_train.py against two, per CPU-second); a probe needing more
# than this costs an interval at a fraction of the speed and is never kept (at 90% of a
# 2-core peak, one thread's probes cost 3-10% of the run: docs/benchmarks.md).
MAX_PER_CORE_GAIN = 1.5


def lever_gain_bound(candidates: list[LeverSetting], demand_cores: float,
                     target_cores: float, max_slowdown: float | None) -> float | None:
    """The most of the run's time any candidate can save against the defaults at the
    rate the budget gives them (at or under 0: none can win); None where no bound is
    known (a setting other than a thread count: stop pacing, a smaller batch).

    With a budget B the defaults, wanting D cores, run at max(min(D, T), D/B) cores. k
    threads do at most MAX_PER_CORE_GAIN times the defaults' steps per CPU-second on at
    most min(k, T) cores (lifted by the budget they match the defaults' D/B, no more).
    """
    rate = max(min(demand_cores, target_cores),
               demand_cores / max_slowdown if max_slowdown else 0.0)
    best = 0.0
    for c in candidates:
        if c.threads is None or c.batch_scale != 1.0 or c.pacing != Pacing.SLEEP:
            return None
        best = max(best, MAX_PER_CORE_GAIN * min(c.threads, target_cores))
    return 1.0 - rate / best if best else 0.0


def exploration_cost(exploration_seconds: float, demand_cores: float, target_cores: float,
                     max_slowdown: float | None) -> float:
    """The most an exploration of `exploration_seconds` can cost: its probes hold the
    target (the agent's probe hold), where the defaults run D/T times slower than unheld,
    instead of the budget's B: each second costs at most 1 - B*T/D of a second. Without
    a lift (no budget, or a target within it) holding the target is what the run does
    anyway: nothing."""
    if max_slowdown is None:
        return 0.0
    return exploration_seconds * max(
        0.0, 1.0 - max_slowdown * target_cores / max(1e-9, demand_cores))


# The least gain an exploration is assumed to bring where the bound says a lever brings
# less or none (MAX_PER_CORE_GAIN may be wrong for a workload: two threads on this
# machine busy with other work did 4.7x less per CPU-second than one): the probes then
# run once they cost at most 2% of the run's expected length, the "never more than 2%
# slower than a plain quota" goal (docs/benchmarks.md).
INSURANCE_SHARE = 0.02


def worth_exploring(seconds: float, cost_seconds: float, gain: float | None) -> bool:
    """Whether an exploration costing `cost_seconds` pays for itself in a run that has
    stepped for `seconds`, where a lever can save at most `gain` of the time left.

    Nothing is known of the run's length but how long it has lasted, t: a run that has
    lasted t is as likely to end before 2t as after (Gott's rule), so t is what is
    expected to be left, and the exploration pays when t * gain >= its cost. A gain under
    2 * INSURANCE_SHARE counts as that much: the cost is then at most INSURANCE_SHARE of
    the run's expected length, 2t.
    """
    if gain is None or cost_seconds <= 0:
        return True
    return seconds * max(gain, 2 * INSURANCE_SHARE) >= cost_seconds


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
