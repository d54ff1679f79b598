"""The CPU-time token bucket behind both pacing and SIGSTOP duty cycling."""

from __future__ import annotations

import itertools

import pytest

from throttledjob.runtime.budget import CpuBudget


def simulate(budget: CpuBudget, demand_cores: float, seconds: float, dt: float = 0.01):
    """A process that wants `demand_cores` and obeys every pause; returns (cpu, wall)."""
    cpu, wall, _ = trace(budget, demand_cores, seconds, dt)
    return cpu, wall


def trace(budget: CpuBudget, demand_cores: float, seconds: float, dt: float = 0.01):
    """As simulate, also returning the (wall, cpu) after each step and its pause."""
    cpu = wall = 0.0
    points = [(wall, cpu)]
    budget.pause_for(cpu, wall)
    while wall < seconds:
        cpu += demand_cores * dt
        wall += dt
        points.append((wall, cpu))
        pause = budget.pause_for(cpu, wall)
        if pause:
            wall += pause
            budget.record_pause(pause)
            points.append((wall, cpu))
    return cpu, wall, points


def cpu_at(points, t: float) -> float:
    """CPU used by wall time `t`, usage linear within each step."""
    for (w0, c0), (w1, c1) in itertools.pairwise(points):
        if w0 <= t <= w1:
            return c0 + (c1 - c0) * ((t - w0) / (w1 - w0) if w1 > w0 else 1.0)
    return points[-1][1]


def worst_window(points, after: float = 0.0, window: float = 1.0) -> float:
    """Most cores used in any `window` seconds starting after `after`."""
    starts = [w for w, _ in points if after <= w and w + window <= points[-1][0]]
    return max(cpu_at(points, t + window) - cpu_at(points, t) for t in starts) / window


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


@pytest.mark.parametrize("step_seconds", [0.02, 0.05, 0.1, 0.2])
@pytest.mark.parametrize("rate", [0.15, 0.6])
def test_long_steps_are_charged_in_full(step_seconds, rate):
    """Steps longer than the burst (a slow machine, a coarse loop) hold the rate after
    start-up (where the slowdown budget has not yet earned long pauses), and no 1-second
    window exceeds it by more than the burst and one step's work. (Forgiving debt beyond
    0.2 s of quota ran 50 ms steps at 0.15 cores at 0.2, every window.)"""
    b = CpuBudget(rate_cores=rate, burst_seconds=0.03, min_pause_seconds=0.02,
                  max_pause_fraction=0.95)
    cpu, wall, points = trace(b, 1.0, 30.0, dt=step_seconds)
    steady = (cpu - cpu_at(points, 5.0)) / (wall - 5.0)
    assert steady == pytest.approx(rate, rel=0.03)
    assert worst_window(points, after=5.0) <= rate * 1.03 + step_seconds * (1 - rate) + 0.01
    assert not b.pause_capped


def test_capped_pauses_leave_no_backlog():
    """What the slowdown budget refused is not paid later: once the budget is lifted the
    work runs at the quota, with no stall for the debt of the capped period."""
    b = CpuBudget(rate_cores=0.5, max_pause_fraction=0.1)
    cpu0, wall0 = simulate(b, 1.0, 10.0)
    assert b.pause_capped
    b.set(0.5, 0.9)
    b.pause_for(cpu0, wall0)  # a new baseline is not needed: the next step pauses little
    pause = b.pause_for(cpu0 + 0.01, wall0 + 0.01)
    assert pause <= 0.05


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
                if not b.pause_capped:  # (the slowdown budget may cut the first short)
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


def test_slowdown_budget_counts_from_the_start_of_the_work():
    """Time run unpaused before the first reading (imports, loading data) earns pause
    budget: the first steps are paced in full, not let through at 1.4 cores."""
    started_early = CpuBudget(rate_cores=1.0, max_pause_fraction=0.2, start_wall=0.0)
    at_first_step = CpuBudget(rate_cores=1.0, max_pause_fraction=0.2)
    for b in (started_early, at_first_step):
        b.pause_for(0.0, 3.0)
    assert started_early.pause_for(0.2, 3.1) == pytest.approx(0.1, abs=0.06)
    assert not started_early.pause_capped
    assert at_first_step.pause_for(0.2, 3.1) <= 0.02 + 1e-9
    assert at_first_step.pause_capped



def test_a_capped_budget_stays_capped_between_pauses():
    """A real pause lasts a little longer than asked (stopping and resuming a tree take
    a few ms), so the reading after a capped pause finds the bucket refilled: no pause is
    wanted, none refused. The budget still holds the work back; the flag must not flicker
    with it (it did, and a run held back by the budget throughout reported 0 s of it)."""
    b = CpuBudget(rate_cores=0.5, max_pause_fraction=0.2)
    cpu = wall = 0.0
    b.pause_for(cpu, wall)
    capped = []
    while wall < 10.0:  # as the enforcer's loop: a tick of work, or a pause and a reading
        pause = b.pause_for(cpu, wall)
        if pause:
            wall += pause + 0.002
            b.record_pause(pause + 0.002)
        else:
            cpu += 2.0 * 0.02
            wall += 0.02
        capped.append(b.pause_capped)
    assert all(capped[50:]), "".join("1" if c else "0" for c in capped)
    b.set(None, 0.2)
    b.pause_for(cpu, wall + 0.02)
    assert not b.pause_capped


@pytest.mark.parametrize("rate", [1.76, 1.4, 1.0])
def test_another_threads_cpu_handed_over_in_tick_chunks_is_charged(rate):
    """A 2-thread process at 1.6 ms steps: its own thread's CPU shows at once, the other
    thread's only at the kernel's ticks, 10 ms at a time (HZ=100). Capping each reading
    at its own interval dropped most of those chunks: held to 1.76 cores it ran at 2.0,
    never paused (bench/zoo.py matmul under `--enforcement cooperative`)."""
    b = CpuBudget(rate_cores=rate, burst_seconds=0.03, min_pause_seconds=0.02,
                  max_pause_fraction=0.9)
    wall = cpu = other = 0.0
    b.pause_for(cpu, wall)
    while wall < 10:
        wall += 0.0016
        cpu += 0.0016
        other += 0.0016
        if other >= 0.01:  # the tick lands: the other thread's chunk appears at once
            cpu, other = cpu + 0.01, other - 0.01
        pause = b.pause_for(cpu, wall)
        if pause:
            wall += pause  # both threads wait (the pause stops the work)
            b.record_pause(pause)
    assert cpu / wall == pytest.approx(rate, rel=0.03)


def run_phases(budget: CpuBudget, phases, demand_cores: float = 2.0, dt: float = 0.01):
    """Run a process wanting `demand_cores` through (seconds, max_pause_fraction) phases;
    returns the pause taken in each phase."""
    cpu = wall = 0.0
    budget.pause_for(cpu, wall)
    paused = []
    for seconds, fraction in phases:
        budget.set(budget.rate_cores, fraction)
        before, end = budget.paused_seconds, wall + seconds
        while wall < end:
            cpu += demand_cores * dt
            wall += dt
            pause = budget.pause_for(cpu, wall)
            wall += pause
            budget.record_pause(pause)
        paused.append(budget.paused_seconds - before)
    return paused


def test_the_allowance_accrues_at_the_fraction_in_force():
    """A budget lowered mid-run (a lever's own cost became known) grants the lower
    fraction from then on: the pause earned before is not spent again at the old rate,
    nor does the new rate apply to the time already past."""
    lowered = CpuBudget(rate_cores=0.5)
    first, second = run_phases(lowered, [(10.0, 0.5), (10.0, 0.1)])
    assert first == pytest.approx(5.0, rel=0.05)   # held at 0.5 of wall, as allowed
    # the second phase earns 0.1 of its own wall (0.1 of the whole run would leave
    # nothing: the first phase paused past it)
    assert second == pytest.approx(0.1 * 10.0, abs=0.05)


def test_a_probe_holds_the_rate_off_the_budgets_books():
    """max_pause_fraction None (the sidecar measures a lever setting): the rate is held
    whatever it costs, and what follows is budgeted as if the probe had not run."""
    probed = CpuBudget(rate_cores=0.5)
    unprobed = CpuBudget(rate_cores=0.5)
    before, probe, after = run_phases(probed, [(5.0, 0.2), (5.0, None), (5.0, 0.2)])
    plain = run_phases(unprobed, [(5.0, 0.2), (5.0, 0.2)])
    # the probe held 2 cores of demand to 0.5: paused 3/4 of its wall, none refused
    assert probe / 5.0 == pytest.approx(0.75, abs=0.03)
    assert probed.paused_seconds == pytest.approx(before + probe + after)
    # after it, the same pause as a run that never probed: not repaid, not banked
    assert after == pytest.approx(plain[1], rel=0.05)
    assert before == pytest.approx(plain[0], rel=0.05)
