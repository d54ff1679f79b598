"""The kernel's CPU counters of a cgroup, and what they say about the time held back.

`ThrottleStats` is what cpu.stat holds (cumulative since the cgroup was made);
`ThrottleAccount` turns successive readings into wall time held back and the width the
tree wanted, for a quota of our own (local_quota) and for each workload container's
(container_quota) alike. The arithmetic is pure; the readers are thin.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field


@dataclass
class ThrottleStats:
    """The kernel's counters from cpu.stat (cumulative since the cgroup was made)."""

    nr_periods: int = 0
    nr_throttled: int = 0
    # Summed over CPUs: each CPU's run queue of the group counts its own throttled time,
    # so two busy threads held back for the same 50 ms count 100 ms.
    throttled_seconds: float = 0.0
    # CPU seconds the group used (v2's usage_usec); None on v1, whose cpu.stat has none.
    usage_seconds: float | None = None


def parse_cpu_stat(text: str) -> ThrottleStats:
    """The counters of a cpu.stat text (v2: *_usec; v1: throttled_time in ns)."""
    values = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            values[key] = int(value)
    throttled = (values["throttled_usec"] / 1e6 if "throttled_usec" in values
                 else values.get("throttled_time", 0) / 1e9)
    usage = values["usage_usec"] / 1e6 if "usage_usec" in values else None
    return ThrottleStats(values.get("nr_periods", 0), values.get("nr_throttled", 0), throttled,
                         usage)


def read_stats(path: str) -> ThrottleStats:
    """The counters of the cgroup directory `path` (OSError when it is gone)."""
    with open(os.path.join(path, "cpu.stat")) as f:
        return parse_cpu_stat(f.read())


def read_usage_seconds(path: str, stats: ThrottleStats) -> float:
    """CPU seconds a cgroup used: v2's from its cpu.stat (`stats`, read already), v1's
    cpuacct.usage (in the cpu directory where the two controllers share a mount, else
    beside it)."""
    if stats.usage_seconds is not None:
        return stats.usage_seconds
    for candidate in (path, os.path.join(os.path.dirname(path), "cpuacct")):
        with contextlib.suppress(FileNotFoundError), \
                open(os.path.join(candidate, "cpuacct.usage")) as f:
            return int(f.read()) / 1e9
    raise FileNotFoundError(f"no CPU usage counter in {path}")


def throttled_width(periods: int, throttled_seconds: float, quota_seconds: float,
                    period_seconds: float) -> float:
    """The cores a tree wanted in `periods` throttled periods, from the kernel's throttled
    time over them.

    throttled_time is summed over CPUs, so it is not wall time: a tree of width w
    (threads able to run) held to quota Q per period P is throttled for t = w*P - Q per
    period, so w = (t + Q) / P. Exact for a saturating tree; measured, not guessed.
    """
    return (throttled_seconds / periods + quota_seconds) / period_seconds


def held_back_seconds(periods: int, throttled_seconds: float, quota_seconds: float,
                      period_seconds: float) -> float:
    """Wall time a tree was held back in `periods` throttled periods: a tree of width w
    (throttled_width) held to quota Q waits P - Q/w of each period P."""
    width = throttled_width(periods, throttled_seconds, quota_seconds, period_seconds)
    return periods * (period_seconds - quota_seconds / width)


@dataclass
class ThrottleAccount:
    """One cgroup's throttling, accounted from successive cpu.stat readings: the wall
    time it was held back and the width of its last throttled periods, since `baseline`
    (the counters of the last reading taken, cumulative: the run's totals)."""

    baseline: ThrottleStats = field(default_factory=ThrottleStats)
    paused_seconds: float = 0.0
    # Cores the tree wanted, from its last throttled periods (None: never throttled).
    width: float | None = None

    def add(self, now: ThrottleStats, quota_seconds: float | None,
            period_seconds: float) -> float | None:
        """Account the periods between the baseline and `now`, throttled under a quota of
        `quota_seconds` per `period_seconds` (None: unlimited, nothing is held back);
        returns the width measured in them, or None when none was throttled."""
        periods = now.nr_throttled - self.baseline.nr_throttled
        throttled = now.throttled_seconds - self.baseline.throttled_seconds
        width = None
        if periods > 0 and throttled > 0 and quota_seconds:
            self.paused_seconds += held_back_seconds(periods, throttled, quota_seconds,
                                                     period_seconds)
            self.width = width = throttled_width(periods, throttled, quota_seconds,
                                                 period_seconds)
        # Counters behind the baseline are not the cgroup's (zeros read as it is removed):
        # the baseline, and with it the run's totals, stays.
        if now.nr_periods >= self.baseline.nr_periods:
            self.baseline = now
        return width
