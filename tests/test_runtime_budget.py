"""The CPU-time token bucket behind both pacing and SIGSTOP duty cycling."""

from __future__ import annotations

import pytest

from throttledjob.runtime.budget import CpuBudget


def simulate(budget: CpuBudget, demand_cores: float, seconds: float, dt: float = 0.01):
    """A process that wants `demand_cores` and obeys every pause; returns (cpu, wall)."""
    cpu = wall = 0.0
    budget.pause_for(cpu, wall)
    while wall < seconds:
        cpu += demand_cores * dt
        wall += dt
        pause = budget.pause_for(cpu, wall)
        if pause:
            wall += pause
            budget.record_pause(pause)
    return cpu, wall


def test_unlimited_budget_never_pauses():
    b = CpuBudget(rate_cores=None)
    cpu, _ = simulate(b, 2.0, 5.0)
    assert b.paused_seconds == 0.0 and cpu == pytest.approx(10.0, rel=0.01)


def test_holds_average_rate_to_quota():
    b = CpuBudget(rate_cores=1.0, max_pause_fraction=0.9)
    cpu, wall = simulate(b, 2.0, 10.0)
    assert cpu / wall == pytest.approx(1.0, rel=0.02)


def test_every_one_second_window_stays_near_quota():
    b = CpuBudget(rate_cores=1.0, burst_seconds=0.05, max_pause_fraction=0.9)
    trace = []  # (wall, cpu) after each step
    cpu = wall = 0.0
    b.pause_for(cpu, wall)
    while wall < 10:
        cpu += 0.02
        wall += 0.01
        pause = b.pause_for(cpu, wall)
        wall += pause
        b.record_pause(pause)
        trace.append((wall, cpu))
    for i, (w0, c0) in enumerate(trace):
        later = [c for w, c in trace[i:] if w <= w0 + 1.0]
        if trace[-1][0] >= w0 + 1.0:
            assert later[-1] - c0 <= 1.0 * (1 + 0.05) + 0.02


def test_workload_under_quota_is_never_paused():
    b = CpuBudget(rate_cores=1.0, max_pause_fraction=0.5)
    simulate(b, 0.8, 10.0)
    assert b.paused_seconds == 0.0


@pytest.mark.parametrize("max_slowdown", [1.1, 1.25, 2.0])
def test_pause_cap_bounds_slowdown(max_slowdown):
    b = CpuBudget(rate_cores=0.5, max_pause_fraction=1 - 1 / max_slowdown)
    cpu, wall = simulate(b, 2.0, 20.0)
    unthrottled_wall = cpu / 2.0
    assert wall / unthrottled_wall <= max_slowdown * 1.01
    assert b.pause_capped


def test_debt_is_bounded_after_a_late_burst_of_cpu():
    b = CpuBudget(rate_cores=1.0, max_pause_fraction=0.9)
    b.pause_for(0.0, 0.0)
    # 3 core-seconds appear at once (a child found late): pause at most a fraction of a second
    assert b.pause_for(3.0, 0.01) <= 0.25


def test_short_steps_are_paced_in_few_long_pauses_at_the_same_rate():
    """1 ms steps at 2 cores, held to 1 core: with a 20 ms minimum pause the rate holds
    as before, with a tenth of the pauses, each at least 20 ms, and 1-second windows
    stay within the burst plus one minimum pause of the quota."""
    counts = {}
    for min_pause in (0.0, 0.02):
        b = CpuBudget(rate_cores=1.0, max_pause_fraction=0.9, min_pause_seconds=min_pause)
        pauses, trace, cpu, wall = [], [], 0.0, 0.0
        b.pause_for(cpu, wall)
        while wall < 10:
            cpu += 0.002
            wall += 0.001
            pause = b.pause_for(cpu, wall)
            if pause:
                pauses.append(pause)
                wall += pause
                b.record_pause(pause)
            trace.append((wall, cpu))
        assert cpu / wall == pytest.approx(1.0, rel=0.02)
        assert min(pauses) >= min_pause
        for i, (w0, c0) in enumerate(trace[::50]):
            later = [c for w, c in trace[i * 50:] if w <= w0 + 1.0]
            if trace[-1][0] >= w0 + 1.0:
                assert later[-1] - c0 <= 1.0 * (1 + 0.05 + min_pause) + 0.002
        counts[min_pause] = len(pauses)
    assert counts[0.02] * 10 <= counts[0.0]
