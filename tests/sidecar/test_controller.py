"""The CPU controller on synthetic traces: a plant model stands in for real processes."""

from __future__ import annotations

import random
import statistics

import pytest

from throttledjob.sidecar.cpu.controller import DEFAULT_MARGIN, CpuController, CpuObservation
from throttledjob.sidecar.stats import PeakStats


class Plant:
    """A workload behind a token-bucket actuator that sees `visible` of the real usage.

    With visible < 1 part of the work escapes the actuator (uncooperative children):
    the controller's trim must make up for it.
    """

    def __init__(self, visible: float = 1.0, noise: float = 0.0, seed: int = 1) -> None:
        self.visible = visible
        self.noise = noise
        self.rng = random.Random(seed)

    def run(self, demand: float, quota: float, cap: float = 0.9) -> CpuObservation:
        hidden = demand * (1 - self.visible)
        allowed_visible = min(demand * self.visible, quota)
        pause = 1 - allowed_visible / (demand * self.visible) if demand else 0.0
        capped = pause > cap
        if capped:
            pause = cap
            allowed_visible = demand * self.visible * (1 - cap)
        usage = allowed_visible + hidden * (1 - pause)
        usage *= 1 + self.rng.gauss(0, self.noise)
        return CpuObservation(max(0.0, usage), pause, capped)


def drive(ctl: CpuController, plant: Plant, demands, cap: float = 0.9):
    usages, quotas, decisions = [], [], []
    for d in demands:
        obs = plant.run(d, ctl.rate, cap)
        decision = ctl.update(obs)
        usages.append(obs.usage_cores)
        quotas.append(decision.rate_cores)
        decisions.append(decision)
    return usages, quotas, decisions


def test_under_target_does_nothing():
    ctl = CpuController(1.0)
    _, quotas, decisions = drive(ctl, Plant(), [0.5] * 50)
    assert set(quotas) == {ctl.setpoint}
    assert not any(d.throttling for d in decisions)


def test_saturating_load_is_held_at_target_without_oscillation():
    ctl = CpuController(1.0)
    usages, quotas, _ = drive(ctl, Plant(noise=0.01), [2.0] * 100)
    tail = usages[20:]
    stats = PeakStats()
    for u in tail:
        stats.add(u)
    assert stats.p99 <= 1.03
    assert statistics.mean(tail) == pytest.approx(ctl.setpoint, rel=0.02)
    # no limit cycle: the quota settles instead of swinging
    assert max(quotas[20:]) - min(quotas[20:]) < 0.05


def test_trim_compensates_usage_the_actuator_cannot_see():
    ctl = CpuController(1.0)
    usages, _, _ = drive(ctl, Plant(visible=0.7), [2.0] * 60)
    assert usages[0] > 1.1  # the bare quota lets the hidden part through
    assert all(abs(u - ctl.setpoint) < 0.02 for u in usages[-20:])


def test_reacts_to_a_load_step_within_two_intervals():
    ctl = CpuController(1.0)
    demands = [0.3] * 20 + [2.0] * 20
    usages, _, _ = drive(ctl, Plant(visible=0.8), demands)
    assert all(u <= 1.0 * 1.05 for u in usages[22:])


def test_no_windup_during_idle_periods():
    ctl = CpuController(1.0)
    drive(ctl, Plant(), [2.0] * 20)
    before = ctl.rate
    drive(ctl, Plant(), [0.0] * 200)  # a long idle wait
    assert ctl.rate == before
    usages, _, _ = drive(ctl, Plant(), [2.0])  # the next burst is held at once
    assert usages[0] <= 1.0


def test_quota_winds_up_slowly_and_boundedly_while_something_else_holds_usage_down():
    ctl = CpuController(1.0)
    # Pacing binds, but a neighbour leaves the workload only 0.3 cores for a minute.
    for _ in range(60):
        ctl.update(CpuObservation(usage_cores=0.3, pause_fraction=0.2))
    assert ctl.rate <= 1.5 * ctl.setpoint
    # The neighbour leaves: the quota comes back down by a tenth of the setpoint a step.
    usages = []
    for _ in range(12):
        usage = min(2.0, ctl.rate)
        usages.append(usage)
        ctl.update(CpuObservation(usage_cores=usage, pause_fraction=0.5))
    assert usages[-1] <= 1.01 * ctl.setpoint
    assert sum(u > 1.05 for u in usages) <= 6


def test_partly_idle_intervals_under_signals_never_raise_the_quota():
    ctl = CpuController(1.0)
    # Bursts that end mid-interval: paused part of the time, yet under the setpoint.
    for _ in range(30):
        ctl.update(CpuObservation(usage_cores=0.5, pause_fraction=0.25,
                                  may_under_deliver=False))
    assert ctl.rate == ctl.setpoint
    ctl.update(CpuObservation(usage_cores=1.2, pause_fraction=0.4, may_under_deliver=False))
    assert ctl.rate < ctl.setpoint  # escaping usage still brings it down


def test_budget_exhaustion_is_reported_and_does_not_wind_down():
    ctl = CpuController(0.5)
    usages, quotas, decisions = drive(ctl, Plant(), [2.0] * 30, cap=0.2)
    assert all(d.budget_exhausted for d in decisions)
    assert usages[-1] == pytest.approx(2.0 * 0.8)
    assert quotas[-1] == pytest.approx(ctl.setpoint)


def test_fixed_mode_never_changes_the_quota():
    ctl = CpuController(1.0, adaptive=False)
    _, quotas, _ = drive(ctl, Plant(visible=0.5), [2.0] * 30)
    assert set(quotas) == {ctl.setpoint}


def test_deterministic():
    runs = [drive(CpuController(1.2), Plant(noise=0.05, seed=7), [1.8] * 40)[1]
            for _ in range(2)]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("kwargs", [{"target_cores": 0}, {"target_cores": 1, "margin": 0.6},
                                    {"target_cores": 1, "gain": 0}])
def test_bad_configuration_is_refused(kwargs):
    with pytest.raises(ValueError):
        CpuController(**kwargs)


def test_peak_stats_match_a_sorted_list():
    rng = random.Random(3)
    values = [rng.uniform(0, 4) for _ in range(1000)]
    stats = PeakStats(resolution=0.001)
    for v in values:
        stats.add(v)
    ordered = sorted(values)
    assert ordered[989] <= stats.p99 <= ordered[989] + 0.001  # never under the truth
    assert stats.max == max(values)
    assert stats.mean == pytest.approx(statistics.mean(values))
    stats.add(float("nan"))
    assert stats.count == 1000


def test_the_kernel_quota_aims_at_the_target_and_other_enforcers_under_it():
    """The margin keeps the 1-second peaks of pacing and signals under the target; the
    kernel holds every period to its quota, so under it the margin only costs time."""
    from throttledjob.contracts.policy import Enforcement, Policy
    from throttledjob.sidecar.cpu.decide import cpu_controller

    kernel = cpu_controller(Policy(cpu_peak_cores=1.0, enforcement=Enforcement.QUOTA))
    assert kernel is not None and kernel.rate == 1.0
    for enforcement in (Enforcement.SIGNALS, Enforcement.BOTH, Enforcement.COOPERATIVE):
        other = cpu_controller(Policy(cpu_peak_cores=1.0, enforcement=enforcement))
        assert other is not None and other.rate == pytest.approx(1.0 - DEFAULT_MARGIN)
    assert cpu_controller(Policy(cpu_peak_cores=None)) is None
