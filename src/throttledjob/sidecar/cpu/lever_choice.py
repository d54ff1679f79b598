"""The cooperative levers in force and the explorer that chooses them (explorer.py), fed
one interval at a time by the agent: the explorer's step clock, when it may run, its
probe hold, the bookkeeping of its measurements, and the busy time run under each
setting, for what the settings cost (lever_time.py). A measurement runs with the target
held, off the slowdown budget's books (a probe is the product's experiment, not the
user's cost), for at most PROBE_HOLD_INTERVALS intervals in a row: one stalled by idle
intervals is budgeted again.
"""

from __future__ import annotations

import os

from throttledjob.contracts.policy import Enforcement, Policy

from ..stats import round_or_none
from .enforcement import Plan
from .explorer import Explorer
from .lever_settings import DEFAULT_SETTING, LeverSample, LeverSetting, probe_order
from .lever_time import LeverLedger, LeverTime, busy_seconds
from .measure import ProgressClock, Sample, progress_clock, steps_in_interval

PROBE_HOLD_INTERVALS = 8


def explorable(policy: Policy, plan: Plan) -> bool:
    """Levers are explored only where the runtime applies them and the user left them
    free: adaptive mode, a CPU target, not signals alone, no static levers."""
    return bool(policy.cpu_peak_cores and policy.adaptive
                and plan.enforcement is not Enforcement.SIGNALS
                and policy.threads is None and policy.batch_scale == 1.0)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class LeverChoice:
    """What the levers are, interval by interval; made with no explorer, which starts at
    the first reported step (when the levers the workload uses are known)."""

    def __init__(self) -> None:
        self.explorer: Explorer | None = None
        self._steps: int | None = None
        # The runtime's clocks when it wrote the steps last seen (progress_clock).
        self._clock: ProgressClock | None = None
        self._probed: LeverSetting | None = None  # the setting being measured
        self._probe_intervals = 0  # intervals in a row it was held for
        self.probe_seconds = 0.0
        self.probe_max_cores: float | None = None
        # Busy time under each setting, kept across a new explorer (a live edit).
        self.ledger = LeverLedger(usable_cores())

    def levers(self, policy: Policy) -> LeverSetting:
        """The levers in force: the explorer's choice, else the policy's."""
        if self.explorer is not None:
            return self.explorer.levers
        return LeverSetting(policy.threads, policy.batch_scale)

    @property
    def probing(self) -> bool:
        """The next interval measures a lever setting: held at the target, unbudgeted."""
        return 0 < self._probe_intervals <= PROBE_HOLD_INTERVALS

    def observe(self, sample: Sample, policy: Policy, plan: Plan, can_stop: bool) -> None:
        """One interval, which ran under the levers chosen before it: the probe's time,
        the explorer's update, and whether the next interval is held as a probe.
        `can_stop`: the sidecar may stop the tree (pacing by stop is a candidate)."""
        before = self.levers(policy)
        self.ledger.add(before, self._busy_seconds(before, sample))
        if self.probing:
            self.probe_seconds += sample.elapsed
            self.probe_max_cores = max(self.probe_max_cores or 0.0, sample.usage_cores)
        if explorable(policy, plan):
            self._explore(sample, policy, can_stop)
        after = self.levers(policy)
        measured = after if self.explorer and self.explorer.measuring else None
        if measured is None and self._probed is not None and after != before:
            # The probes ended on a change of setting: its first interval is held at the
            # target too. The kernel's last width was the probed setting's (2 threads),
            # and the budget's floor read from it lifted one thread's quota to 1.24
            # cores: a second at 1.09 for a 1-core target.
            measured = after
        self._probe_intervals = (0 if measured is None else self._probe_intervals + 1
                                 if measured == self._probed else 1)
        self._probed = measured

    def _explore(self, sample: Sample, policy: Policy, can_stop: bool) -> None:
        steps = sample.steps
        done = 0 if self._steps is None else max(0, steps - self._steps)
        clock = progress_clock(sample.records)
        if done and self._clock is not None:
            done = steps_in_interval(done, self._clock, clock, sample.elapsed)
        self._steps, self._clock = steps, clock
        if self.explorer is None:
            if not done:
                return  # no step reported (yet): the policy's levers, as without explorer
            candidates = probe_order(usable_cores(), policy.cpu_peak_cores, can_stop)
            if any(r.batch_size is not None for r in sample.records):  # tj.batch_size()
                candidates += [LeverSetting(batch_scale=0.5)]
            if not candidates:
                return
            self.explorer = Explorer(policy.cpu_peak_cores, candidates,
                                     max_slowdown=policy.budget_slowdown)
        self.explorer.update(LeverSample(sample.usage_cores, sample.held_back, done,
                                         sample.elapsed, cores=usable_cores(),
                                         busy_width=sample.busy_width))

    def set_policy(self, old: Policy, old_plan: Plan, new: Policy, new_plan: Plan) -> None:
        """A live edit: the explorer starts over where what may be explored changed,
        else follows the new target and budget."""
        if explorable(old, old_plan) != explorable(new, new_plan):
            self.explorer, self._steps = None, None
        elif self.explorer and new.cpu_peak_cores != old.cpu_peak_cores:
            self.explorer.set_target(new.cpu_peak_cores)
        if self.explorer:
            self.explorer.max_slowdown = new.budget_slowdown

    def lever_slowdown(self, levers: LeverSetting | None = None,
                       most: bool = False) -> float | None:
        """What `levers` (those in force) cost by themselves; None: not known."""
        return self.explorer.lever_slowdown(levers, most=most) if self.explorer else None

    def lever_time(self) -> LeverTime:
        """The time the settings run so far lost by themselves (lever_time.py)."""
        return self.ledger.time(lambda levers: self.lever_slowdown(levers),
                                lambda levers: self.lever_slowdown(levers, most=True))

    def _busy_seconds(self, levers: LeverSetting, sample: Sample) -> float:
        """The interval's busy time under `levers` (lever_time.busy_seconds)."""
        known = self.explorer.estimates.get(levers) if self.explorer else None
        return busy_seconds(sample.elapsed, sample.held_back, sample.used_seconds,
                            known.peak_cores if known else None)

    def report(self) -> dict | None:
        """What the explorer measured and chose (None when it never ran)."""
        ex = self.explorer
        if ex is None:
            return None
        decision = ex.decision()
        return {
            "state": decision.state, "levers": str(decision.levers),
            "predicted_slowdown": decision.predicted_slowdown,
            "explorations": ex.explorations,
            # R0, the defaults' busy-time steps per second unheld, and the most it can be
            # (Explorer.unthrottled_rate_high); None until the defaults were measured.
            "unthrottled_steps_per_second": round_or_none(ex.unthrottled_rate()),
            "unthrottled_steps_per_second_high": round_or_none(ex.unthrottled_rate_high()),
            "estimates": {str(e.levers): {"steps_per_cpu_second": round(e.efficiency, 3),
                                          "peak_cores": round(e.peak_cores, 3),
                                          "samples": e.samples, "aborted": e.aborted}
                          for e in ex.estimates.values()},
            "chose_non_default": decision.levers != DEFAULT_SETTING,
            "history": [f"{state}({levers})" for state, levers in ex.history],
            # levers, cores used, paused fraction, steps per second: the last intervals
            "trace": [[str(levers), round(s.usage_cores, 3), round(s.pause_fraction, 3),
                       round(s.steps / s.elapsed_seconds, 1)] for levers, s in ex.trace],
        }
