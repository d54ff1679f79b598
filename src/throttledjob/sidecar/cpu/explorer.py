"""Online lever exploration: find, per workload, the cooperative levers that cost least.

Duty cycling (a CPU rate, held by the kernel's quota, signals or pacing) cuts a peak at
a slowdown in proportion: a workload that wants D cores, held to T, runs at T/D of its
speed. Other levers are cheaper on some
workloads: fewer threads on one that scales poorly with threads (a memory-bound
elementwise loop loses little speed but half its cores from 2 threads to 1) or a smaller
micro-batch. They cost *more* on others (a matmul-bound loop loses speed in proportion to
threads, no better than duty cycling). Which is which can only be measured, so this unit
measures it online, as Zeus's power-limit optimizer does for GPU power limits.

The model of what a setting does (its throughput under the target) is in lever_settings.py.

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

from ..phase_gate import MIN_GAIN, PhaseGate
from .exploration_cost import exploration_cost, lever_gain_bound, worth_exploring
from .lever_settings import (
    DEFAULT_SETTING,
    Estimate,
    LeverSample,
    LeverSetting,
    fewer_threads,
    more_threads,
)

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
        quota's period, docs/dev/benchmarks.md). Unheld, the defaults do no more steps per
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
            self._queue = [c for c in self._queue if not fewer_threads(c, estimate.levers)]
        self._queue = [c for c in self._queue if not self._dominated(c)]
        if self._queue:
            self._measure(self._queue.pop(0), self.probe_intervals, self.settle_intervals)
        else:
            self._settle()

    def _dominated(self, candidate: LeverSetting) -> bool:
        """More threads than a setting measured at the target: they would be duty-cycled
        to the same cores at fewer steps per CPU-second (the prior in the module doc).
        Wanting the target (`wants_target`) counts as at it: no more than that is left to win.
        Under a slowdown budget the defaults are never dominated: R0 is theirs."""
        if self.max_slowdown is not None and candidate == DEFAULT_SETTING:
            return False
        return any(more_threads(candidate, e.levers) and e.wants(self.target)
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
