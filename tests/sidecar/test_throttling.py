"""The kernel's throttling counters and their one account (sidecar/cpu/cgroups/throttling.py),
on synthetic cpu.stat readings: a tree 2 cores wide held to 1 core per 100 ms period is
throttled 100 ms (summed over CPUs) in each, and waits half of the wall time."""

from __future__ import annotations

import pytest

from throttledjob.sidecar.cpu.cgroups.throttling import (
    ThrottleAccount,
    ThrottleStats,
    parse_cpu_stat,
)

PERIOD = 0.1
ONE_CORE = 0.1  # quota seconds per PERIOD


def after(start: ThrottleStats, periods: int, throttled: int) -> ThrottleStats:
    """`start` plus `periods` periods, `throttled` of them throttled with a 2-wide tree."""
    return ThrottleStats(start.nr_periods + periods, start.nr_throttled + throttled,
                         start.throttled_seconds + throttled * 0.1)


def test_only_the_periods_since_the_baseline_are_counted():
    # A cgroup throttled long before the account began (a container already running when
    # the sidecar restarted): its 500 earlier throttled periods are not this run's.
    earlier = ThrottleStats(nr_periods=1000, nr_throttled=500, throttled_seconds=50.0)
    account = ThrottleAccount(earlier)
    width = account.add(after(earlier, 10, 10), ONE_CORE, PERIOD)
    assert width == pytest.approx(2.0)
    assert account.paused_seconds == pytest.approx(0.5)  # 10 periods, waiting half of each
    # The next reading counts from this one, not again from the start.
    account.add(after(after(earlier, 10, 10), 10, 4), ONE_CORE, PERIOD)
    assert account.paused_seconds == pytest.approx(0.5 + 0.2)
    assert account.baseline == after(after(earlier, 10, 10), 10, 4)


def test_a_cgroup_read_as_zeros_keeps_the_totals_and_counts_nothing():
    # A removed cgroup reads as zeros (CgroupQuota.stats): neither a negative delta nor a
    # baseline reset, after which the next real reading would count everything again.
    start = ThrottleStats()
    account = ThrottleAccount(start)
    account.add(after(start, 20, 10), ONE_CORE, PERIOD)
    totals, paused = account.baseline, account.paused_seconds
    assert account.add(ThrottleStats(), ONE_CORE, PERIOD) is None
    assert account.baseline == totals and account.paused_seconds == paused
    account.add(after(totals, 10, 10), ONE_CORE, PERIOD)
    assert account.paused_seconds == pytest.approx(paused + 0.5)
    assert account.width == pytest.approx(2.0)


def test_without_a_quota_nothing_is_held_back_but_the_baseline_moves():
    # Periods throttled while the quota was lifted (None) are not held against a quota
    # set later: the baseline moves past them.
    start = ThrottleStats(nr_periods=10)
    account = ThrottleAccount(start)
    unlimited = after(start, 10, 10)
    assert account.add(unlimited, None, PERIOD) is None
    assert account.paused_seconds == 0.0 and account.width is None
    account.add(after(unlimited, 10, 2), ONE_CORE, PERIOD)
    assert account.paused_seconds == pytest.approx(0.1)


def test_the_last_width_stays_while_nothing_is_throttled():
    account = ThrottleAccount()
    held = after(ThrottleStats(), 10, 10)
    account.add(held, ONE_CORE, PERIOD)
    assert account.add(after(held, 10, 0), ONE_CORE, PERIOD) is None  # under the quota
    assert account.width == pytest.approx(2.0)


def test_cpu_stat_is_read_in_its_own_units_on_v1_and_v2():
    v2 = parse_cpu_stat("usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n"
                        "nr_periods 40\nnr_throttled 8\nthrottled_usec 250000\n")
    assert v2 == ThrottleStats(40, 8, 0.25, 1.5)
    v1 = parse_cpu_stat("nr_periods 40\nnr_throttled 8\nthrottled_time 250000000\n")
    assert v1 == ThrottleStats(40, 8, 0.25, None)  # ns; v1 keeps usage in cpuacct.usage
