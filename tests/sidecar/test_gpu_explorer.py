"""The GPU power-limit lever chosen online, closed loop through the simulated GPU.

The simulator's dynamic power grows with the square of the clock and a workload's speed
with the clock to its `clock_sensitivity` (1: compute-bound, 0.3: memory-bound; 4: a
board or workload where a cap costs more than holding back, as no physical one should).
Each test drives a GpuAgent (sidecar/gpu_agent.py) with a workload reporting its steps,
and checks the explorer's promises: hold the target, take the cheaper lever, touch
nothing under the target, never lift the cap into a target the hold-back cannot hold.
"""

from __future__ import annotations

import pytest

from throttledjob.contracts.policy import Policy
from throttledjob.gpu.fake import FakeGpuBackend
from throttledjob.sidecar.gpu_agent import GpuAgent
from throttledjob.sidecar.gpu_explorer import UNCAPPED, GpuSample, PowerLimitExplorer
from throttledjob.sidecar.gpu_simulate import drive

TARGET = 200.0


def agent_for(gpu: FakeGpuBackend, lever: bool = True, max_slowdown: float = 2.0,
              target: float = TARGET) -> GpuAgent:
    return GpuAgent(gpu, Policy(gpu_peak_power_watts=target, max_slowdown=max_slowdown,
                                gpu_power_limit="allow" if lever else "deny"))


def mean_speed(rows) -> float:
    return sum(r.speed for r in rows) / len(rows)


@pytest.mark.parametrize("sensitivity", [1.0, 0.3])
def test_a_cap_is_chosen_where_it_is_cheaper_and_holds_the_target(sensitivity):
    capped = agent_for(gpu := FakeGpuBackend(1, "steady", clock_sensitivity=sensitivity))
    rows = drive(capped, gpu, 60)
    held = agent_for(held_gpu := FakeGpuBackend(1, "steady", clock_sensitivity=sensitivity),
                     lever=False)
    held_rows = drive(held, held_gpu, 60)
    assert capped.explorer.state == "Settled" and capped.explorer.limit == pytest.approx(194.0)
    estimates = capped.explorer.estimates
    assert estimates[194.0] > estimates[UNCAPPED]   # measured, not assumed
    # From the second interval on (the first is before the sidecar acted) the target holds,
    # during the probes too.
    assert max(r.power_watts for r in rows[1:]) <= TARGET
    # Settled, the cap alone holds it: no hold-back on top of it.
    assert all(r.duty == 0.0 for r in rows[-20:])
    # And it is faster than holding back alone, over the whole run, probes included.
    assert mean_speed(rows) > 1.2 * mean_speed(held_rows)
    assert max(r.power_watts for r in held_rows[2:]) <= TARGET
    capped.close()
    assert gpu.limits == [300.0]   # the board's own limit is back


def test_holding_back_is_kept_where_the_cap_costs_more():
    agent = agent_for(gpu := FakeGpuBackend(1, "steady", clock_sensitivity=4.0))
    rows = drive(agent, gpu, 40)
    assert agent.explorer.state == "Settled" and agent.explorer.limit is UNCAPPED
    assert gpu.limits == [300.0]   # the board's own limit is back
    assert max(r.power_watts for r in rows[1:]) <= TARGET
    assert 0.3 < rows[-1].duty < 0.5


def test_without_steps_the_cap_alone_holds_the_target():
    # No steps: nothing to measure, so the prior. The duty once wound up on top of a cap
    # at the target (41% hold-back for nothing): the cap is now at the setpoint.
    agent = agent_for(gpu := FakeGpuBackend(1, "steady"))
    duty = 0.0
    for _ in range(30):
        gpu.feed(duty)
        duty = agent.cycle(1.0, duty, []) or 0.0
    assert agent.explorer is None and gpu.limits == [194.0]
    assert duty == 0.0 and agent.readings[0].power_watts <= TARGET


def test_a_workload_under_the_target_is_not_touched():
    # 288 W drawn, under a 300 W target and its 291 W setpoint: the cap never binds.
    agent = agent_for(gpu := FakeGpuBackend(1, "steady"), target=300.0)
    rows = drive(agent, gpu, 30)
    assert agent.explorer.state == "Settled"
    assert UNCAPPED not in agent.explorer.estimates   # nothing probed
    assert all(r.speed == 1.0 and r.duty == 0.0 for r in rows)
    # The prior cap is on the board, above the draw: it never binds.
    assert gpu.limits == [291.0] and "sw_power_cap" not in agent.readings[0].throttle_reasons


def test_a_cap_is_not_lifted_into_a_target_the_hold_back_cannot_hold():
    # A slowdown budget of 1.1 allows 9% hold-back; 288 W -> 200 W needs about 40%.
    agent = agent_for(gpu := FakeGpuBackend(1, "steady", clock_sensitivity=4.0),
                      max_slowdown=1.1)
    rows = drive(agent, gpu, 40)
    assert agent.explorer.limit == pytest.approx(194.0)
    assert agent.explorer.estimates[UNCAPPED] == 0.0
    # The abandoned probe cost one interval over the target, no more.
    assert sum(r.power_watts > TARGET for r in rows[1:]) == 1


def test_a_new_phase_is_explored_again():
    # Warm-up at 30% (under the target: the cap does not bind), then a compute plateau.
    agent = agent_for(gpu := FakeGpuBackend(1, "plateau"))
    rows = drive(agent, gpu, 40)
    assert agent.explorer.explorations == 2
    assert agent.explorer.limit == pytest.approx(194.0) and agent.explorer.state == "Settled"
    assert max(r.power_watts for r in rows[1:]) <= TARGET


def test_explorer_ranks_by_steps_with_the_target_held():
    ex = PowerLimitExplorer(200.0, 194.0, samples=2, settle=0)
    assert ex.update(GpuSample(0, 1.0, 150.0)) == 194.0   # no steps yet: the prior
    ex.update(GpuSample(10, 1.0, 194.0))                  # start-up: not a sample
    ex.update(GpuSample(50, 1.0, 194.0, capped=True))
    assert ex.update(GpuSample(50, 1.0, 194.0, capped=True)) is UNCAPPED   # it binds: probe
    assert ex.probing
    ex.update(GpuSample(40, 1.0, 150.0, duty=0.5))   # the hold-back still tracking down
    ex.update(GpuSample(60, 1.0, 190.0, duty=0.3))
    assert ex.probing                                # ...so neither counted
    ex.update(GpuSample(60, 1.0, 190.0, duty=0.3))
    assert ex.update(GpuSample(60, 1.0, 190.0, duty=0.3)) is UNCAPPED
    assert ex.state == "Settled" and ex.estimates == {194.0: 50.0, UNCAPPED: 60.0}
    ex2 = PowerLimitExplorer(200.0, 194.0, samples=2, settle=0)
    for steps in (10, 58.5, 58.5, 60, 60):   # the cap within MIN_GAIN wins the tie
        ex2.update(GpuSample(steps, 1.0, 194.0 if ex2.limit else 190.0, capped=True))
    assert ex2.limit == 194.0 and ex2.state == "Settled"


def test_explorer_refuses_bad_arguments():
    with pytest.raises(ValueError):
        PowerLimitExplorer(0, 194.0)
    with pytest.raises(ValueError):
        PowerLimitExplorer(200.0, 194.0, samples=0)


def test_settled_uncapped_falls_back_to_the_cap_when_the_budget_no_longer_holds():
    agent = agent_for(gpu := FakeGpuBackend(1, "steady", clock_sensitivity=4.0))
    drive(agent, gpu, 40)
    assert agent.explorer.limit is UNCAPPED
    # The slowdown budget is cut live: 9% hold-back cannot hold 200 W any more.
    agent.set_policy(Policy(gpu_peak_power_watts=TARGET, max_slowdown=1.1,
                            gpu_power_limit="allow"))
    rows = drive(agent, gpu, 30)
    assert sum(r.power_watts > TARGET for r in rows) == 1   # one interval, then the cap
    assert agent.explorer.limit == pytest.approx(194.0) and gpu.limits == [194.0]
    assert max(r.power_watts for r in rows[1:]) <= TARGET


def test_a_gpu_watched_later_is_capped_too():
    gpu = FakeGpuBackend(2, "steady")
    agent = agent_for(gpu)
    for visible in (["0"], ["0"], ["0", "1"]):
        agent.cycle(1.0, 0.0, visible)
    assert gpu.limits == [194.0, 194.0]
    agent.close()
    assert gpu.limits == [300.0, 300.0]


def test_a_lost_gpu_gets_its_limit_back_when_it_still_answers():
    # Three failed reads in a row count as lost; the device may still take a write.
    gpu = FakeGpuBackend(2, "steady", fail_after=3)
    agent = agent_for(gpu)
    for _ in range(8):
        agent.cycle(1.0, 0.0, [])
    assert agent.error_lost and gpu.limits == [300.0, 300.0]


class _NoLimitLever(FakeGpuBackend):
    def power_limit_range_watts(self, index: int):
        return None   # as on boards without power management


def test_a_board_without_the_lever_is_held_back_and_never_written():
    gpu = _NoLimitLever(1, "steady")
    agent = agent_for(gpu)
    rows = drive(agent, gpu, 20)
    assert gpu.limit_calls == [] and not agent.capping and agent.explorer is None
    assert max(r.power_watts for r in rows[2:]) <= TARGET   # the hold-back holds it


def test_a_target_over_the_board_limit_caps_nothing():
    gpu = FakeGpuBackend(1, "steady")
    agent = agent_for(gpu, target=350.0)
    rows = drive(agent, gpu, 20)
    assert gpu.limits == [300.0] and not agent.capping and agent.explorer is None
    assert all(r.speed == 1.0 for r in rows)


def test_an_uncapped_probe_finishes_when_the_hold_back_wobbles():
    ex = PowerLimitExplorer(200.0, 194.0, samples=2, settle=0)
    for _ in range(3):
        ex.update(GpuSample(50, 1.0, 194.0, capped=True))
    assert ex.limit is UNCAPPED
    for i in range(12):   # a real reading: the duty never moves less than 0.02
        ex.update(GpuSample(60, 1.0, 190.0, duty=0.4 + 0.05 * (-1) ** i))
    assert ex.state == "Settled" and ex.estimates[UNCAPPED] == 60.0
