"""The GPU control law on scripted traces, closed loop through the simulated GPU.

Each test replays a trace through FakeGpuBackend with a perfect actuator (the duty the
controller asks for is the hold-back in force next interval) and checks the law's
promises: clip to the target, spend no more duty than needed, nothing when under
target, never beyond the budget, say so when the budget is not enough.
"""

from __future__ import annotations

import pytest

from throttledjob.gpu.fake import IDLE_WATTS, FakeGpuBackend
from throttledjob.sidecar.gpu_controller import GpuController, GpuObservation


def replay(trace: str, samples: int = 80, util: float | None = None,
           power: float | None = None, max_duty: float = 0.5, floor: float = 0.0,
           gain: float = 1.0):
    """`gain`: the hold-back the actuator delivers for each unit of duty asked."""
    gpu = FakeGpuBackend(1, trace)
    ctl = GpuController(util, power, max_duty=max_duty)
    duty, rows = 0.0, []
    for _ in range(samples):
        delivered = min(0.99, duty * gain)
        gpu.feed(delivered)
        r = gpu.read()[0]
        d = ctl.update(GpuObservation(r.utilization_ratio if util else None,
                                      r.power_watts if power else None, delivered, floor))
        rows.append((r.utilization_ratio, r.power_watts, duty, d))
        duty = d.duty
    return rows


def test_plateau_is_clipped_to_the_target_within_one_interval():
    rows = replay("plateau", util=0.7)
    # The plateau starts at sample 5; from the next sample on it stays under target...
    assert rows[5][0] > 0.9
    assert all(u <= 0.7 for u, *_ in rows[6:])
    # ...without throttling more than needed (within the 3% margin plus 2%).
    assert all(u >= 0.7 * 0.95 for u, *_ in rows[6:])
    # Before the plateau (30% < 70%) it did nothing at all.
    assert all(duty == 0.0 for _, _, duty, _ in rows[:6])


def test_power_target_converges_despite_idle_power():
    rows = replay("plateau", power=200.0)
    assert rows[5][1] > 280
    settled = [p for _, p, *_ in rows[10:]]
    assert max(settled) <= 200.0
    assert min(settled) >= 200.0 * 0.95


@pytest.mark.parametrize("floor, settles", [(IDLE_WATTS, True), (0.0, False)])
def test_knowing_the_boards_floor_the_power_law_settles_in_one_interval(floor, settles):
    """Power above the idle draw scales with the time not held back: knowing the floor,
    the first correction lands within 5% under the target and stays there (the issue's
    bar on a real board); taken as 0, the first correction falls short (over target)."""
    rows = replay("plateau", power=200.0, floor=floor)
    held = [p for _, p, *_ in rows[6:]]
    assert all(200.0 * 0.95 <= p <= 200.0 for p in held) is settles, held[:4]
    assert max(p for _, p, *_ in rows[7:]) <= 200.0   # from above either way


@pytest.mark.parametrize("gain", [0.85, 1.15])
def test_an_actuator_that_delivers_more_or_less_than_asked_still_settles_at_the_target(gain):
    """The pacing delivers a duty 15% off what was asked (as on a real workload): the
    controller learns the ratio, and power settles within 5% under the target, where a
    law that took the asked duty for the delivered one stayed 11% over or 25% under."""
    rows = replay("plateau", power=200.0, floor=IDLE_WATTS, gain=gain)
    held = [p for _, p, *_ in rows[15:]]
    assert all(200.0 * 0.95 <= p <= 200.0 for p in held), held[:6]
    assert max(p for _, p, *_ in rows[8:]) <= 200.0 * 1.05


def test_a_duty_asked_while_the_gpu_went_unread_is_not_learnt_as_the_actuators_gain():
    """Holding back 0.5 when the GPU's agent went away: nothing was applied while it was
    unread. Back, the controller starts from no hold-back with the gain it had, not one
    learnt from "0.5 asked, 0 delivered" (which asked 0.667 next, past the budget)."""
    ctl = GpuController(0.5, max_duty=0.6)
    ctl.update(GpuObservation(1.0, None, 0.0))
    assert ctl.asked() == pytest.approx(0.5, abs=0.02)
    ctl.stand_down()
    decision = ctl.update(GpuObservation(1.0, None, 0.0))
    assert ctl.gain == 1.0
    assert decision.duty <= 0.6


def test_spike_is_clipped_after_its_first_sample_and_released_later():
    rows = replay("spike", util=0.7, samples=40)
    spike = [u for u, *_ in rows[10:13]]
    assert spike[0] == pytest.approx(1.0)  # feedback cannot see a spike before it happens
    assert max(spike[1:]) <= 0.7
    # After the hold time the duty is released toward zero (the baseline is under target).
    duties = [d.duty for *_, d in rows[13:30]]
    assert duties[-1] < duties[0]


def test_sawtooth_stays_clipped_after_the_first_period():
    rows = replay("sawtooth", util=0.7)
    later = [u for u, *_ in rows[10:]]
    assert max(later) <= 0.7
    # The duty holds across periods instead of oscillating back to zero.
    assert min(d.duty for *_, d in rows[10:]) > 0.2


def test_under_target_does_nothing():
    rows = replay("idle", util=0.7, power=200.0)
    assert all(d.duty == 0.0 and not d.throttling and d.binding is None for *_, d in rows)


def test_budget_caps_the_duty_and_reports_it():
    # 95% -> 50% needs a 47% hold-back; maxSlowdown 1.25 allows 20%.
    rows = replay("steady", util=0.5, max_duty=0.2)
    assert all(d.duty <= 0.2 for *_, d in rows)
    assert rows[-1][3].budget_exhausted
    assert rows[-1][0] == pytest.approx(0.95 * 0.8, abs=0.01)


def test_the_tighter_target_wins():
    rows = replay("steady", util=0.9, power=180.0)
    assert rows[-1][3].binding == "power"
    assert rows[-1][1] <= 180.0


@pytest.mark.parametrize("kwargs", [{"utilization_target_ratio": -1},
                                    {"power_target_watts": 0}, {"max_duty": 1.0},
                                    {"release": 0}])
def test_bad_parameters_are_refused(kwargs):
    with pytest.raises(ValueError):
        GpuController(**kwargs)
