"""What the cooperative lever settings cost by themselves over a run (one thread instead
of two: slower steps that no pause shows), for the slowdown estimate and its interval.

A setting's cost is often measured only after the workload ran under it (the reference,
one thread, runs before the defaults are measured), and that earlier time costs the same:
so the busy time under each setting is kept, and charged at what the setting is known to
cost when the estimate is read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .lever_settings import DEFAULT_SETTING, LeverSetting


@dataclass(frozen=True)
class LeverTime:
    """Seconds lost to the lever settings by themselves, so far."""

    known: float = 0.0    # each setting at what it is known to cost
    # Busy time under settings other than the defaults whose cost is not known: `known`
    # leaves it out, so it is a lower bound while this is over 0.
    unknown: float = 0.0
    # The top: each known setting at the most it can cost (R0 read low under a quota,
    # Explorer.unthrottled_rate_high), the unknown time at max_lever_cost.
    bound: float = 0.0


def busy_seconds(elapsed: float, held_back: float, used_seconds: float,
                 peak_cores: float | None) -> float:
    """An interval's time the workload computed, which is what a setting's own cost
    slows: not held back, and not idle either where the cores the setting keeps busy
    (`peak_cores`, measured by the explorer) are known: its CPU over them. A bursty
    loop's waits, charged at one thread's cost too, read a real 1.45 as 1.7."""
    busy = (1 - held_back) * elapsed
    if peak_cores:
        busy = min(busy, used_seconds / peak_cores)
    return busy


def max_lever_cost(levers: LeverSetting, cores: int) -> float:
    """The most a setting can cost by itself on `cores` CPUs: k threads of n run at
    k/n of the speed at worst (perfect scaling lost), a batch scaled by s at s of it (a
    step's cost all fixed overhead); stopping instead of sleeping costs nothing more."""
    threads = min(cores, levers.threads or cores)
    return (cores / threads) / levers.batch_scale


@dataclass
class LeverLedger:
    """Busy seconds run under each setting, and the last cost each was known at, and
    the most it could be (kept across a new explorer: a live edit)."""

    cores: int
    busy: dict[LeverSetting, float] = field(default_factory=dict)
    costs: dict[LeverSetting, float] = field(default_factory=dict)
    most: dict[LeverSetting, float] = field(default_factory=dict)

    def add(self, levers: LeverSetting, busy_seconds: float) -> None:
        self.busy[levers] = self.busy.get(levers, 0.0) + busy_seconds

    def time(self, cost_of: Callable[[LeverSetting], float | None],
             most_of: Callable[[LeverSetting], float | None]) -> LeverTime:
        """The time lost so far, `cost_of` giving what a setting is known to cost now
        (None: not known) and `most_of` the most it can cost (None: its cost); a setting
        costing c slows its busy time by 1 - 1/c."""
        for levers in self.busy:
            cost = cost_of(levers)
            if cost is not None:
                self.costs[levers] = cost
                # The most is kept at its highest: a later explorer (a live edit) that
                # measures the defaults unheld knows nothing of the time held before.
                most = max(cost, most_of(levers) or cost, self.most.get(levers, 1.0))
                if levers != DEFAULT_SETTING:  # no more than a setting can cost at all
                    most = min(most, max(cost, max_lever_cost(levers, self.cores)))
                self.most[levers] = most
        known = unknown = bound = 0.0
        for levers, busy in self.busy.items():
            cost = self.costs.get(levers)
            if cost is None and levers != DEFAULT_SETTING:
                unknown += busy
                bound += busy * _lost(max_lever_cost(levers, self.cores))
            else:
                known += busy * _lost(cost or 1.0)
                bound += busy * _lost(self.most.get(levers, cost or 1.0))
        return LeverTime(known, unknown, bound)


def _lost(cost: float) -> float:
    """The share of its busy time a setting costing `cost` loses."""
    return 1 - 1 / cost
