"""The lever explorer on synthetic workloads: a model workload stands in for a real one.

A model workload has, per lever setting, an unpaused CPU demand (cores) and a step rate.
A quota (the controller's, always in force) duty-cycles whatever demand is left above
it, and a lever change takes effect half an interval late, as the runtime picks settings
up at its next tick. The tests drive the explorer with it, interval by interval.
"""

from __future__ import annotations

import dataclasses
import os
import random

import pytest

from testing.fake_tree import FakeTree
from throttledjob.sidecar.cpu.exploration_cost import (
    exploration_cost,
    lever_gain_bound,
    worth_exploring,
)
from throttledjob.sidecar.cpu.explorer import Explorer, Measuring, Settled, Waiting
from throttledjob.sidecar.cpu.lever_settings import (
    DEFAULT_SETTING,
    Estimate,
    LeverSample,
    LeverSetting,
    Pacing,
    probe_order,
    thread_candidates,
)

ONE = LeverSetting(threads=1)


class Model:
    """Demand (cores) and step rate (steps/s) per lever setting, unpaused."""

    def __init__(self, table: dict[LeverSetting, tuple[float, float]], noise: float = 0.0,
                 seed: int = 1) -> None:
        self.table = table
        self.noise = noise
        self.rng = random.Random(seed)

    def busy(self, levers: LeverSetting, quota: float, fraction: float = 1.0) -> tuple[float, ...]:
        """Usage, pause fraction, steps over `fraction` of an interval under `levers`."""
        demand, rate = self.table.get(levers, self.table[DEFAULT_SETTING])
        keep = min(1.0, quota / demand)
        jitter = 1 + self.rng.gauss(0, self.noise) if self.noise else 1.0
        return (demand * keep * fraction * jitter, (1 - keep) * fraction,
                rate * keep * fraction * jitter)


def memory_bound(default_threads: int = 2) -> Model:
    # 2 threads -> 1: half the cores, 10% fewer steps (elementwise ops on big tensors)
    return Model({DEFAULT_SETTING: (2.0, 100.0), ONE: (1.0, 90.0)})


def compute_bound() -> Model:
    # matmul: speed in proportion to threads
    return Model({DEFAULT_SETTING: (2.0, 100.0), ONE: (1.0, 50.0)})


def drive(ex: Explorer, model: Model, intervals: int, quota: float | None = None,
          busy=lambda i: 1.0, previous: list | None = None):
    """Run `intervals` control intervals; returns the levers in force in each and the
    steps done. `busy(i)` is the fraction of interval i the workload computes."""
    quota = ex.target if quota is None else quota
    applied = previous[-1] if previous else DEFAULT_SETTING
    levers_seen, steps = [], 0.0
    for i in range(intervals):
        wanted = ex.levers
        frac = busy(i)
        # The change lands half an interval late: the first interval is a mix.
        parts = [(applied, 0.5), (wanted, 0.5)] if wanted != applied else [(wanted, 1.0)]
        usage = pause = done = 0.0
        for levers, share in parts:
            u, p, s = model.busy(levers, quota, frac * share)
            usage, pause, done = usage + u, pause + p, done + s
        applied = wanted
        levers_seen.append(applied)
        steps += done
        ex.update(LeverSample(usage, pause, done, 1.0))
    return levers_seen, steps


def test_memory_bound_workload_gets_fewer_threads_instead_of_duty_cycling():
    ex = Explorer(1.2, [ONE])
    seen, _ = drive(ex, memory_bound(), 30)
    assert isinstance(ex.state, Settled)
    assert ex.levers == ONE
    assert seen[-1] == ONE
    # Measured: duty cycling alone would run at 60 steps/s; one thread runs at 90.
    assert ex.estimates[ONE].throughput(1.2) == pytest.approx(90.0, rel=0.02)
    assert ex.estimates[DEFAULT_SETTING].throughput(1.2) == pytest.approx(60.0, rel=0.02)
    assert ex.decision().predicted_slowdown == pytest.approx(100 / 90, rel=0.02)


def test_memory_bound_near_its_peak_keeps_threads_and_duty_cycles_instead():
    # At 1.9 of 2 cores duty cycling costs 5%, one thread costs 10%: keep the threads.
    ex = Explorer(1.9, [ONE])
    drive(ex, memory_bound(), 30)
    assert isinstance(ex.state, Settled)
    assert ex.levers == DEFAULT_SETTING


def test_compute_bound_workload_keeps_its_threads():
    ex = Explorer(1.5, [ONE])
    drive(ex, compute_bound(), 30)
    # One thread halves speed, duty cycling to 1.5 cores costs a quarter: keep the defaults.
    assert ex.levers == DEFAULT_SETTING
    assert isinstance(ex.state, Settled)


def test_the_defaults_are_measured_in_full_however_they_compare():
    """The defaults measured after one thread (the reference) at a 1-core target look
    clearly worse under the rate, but every cost is read from them: not cut short."""
    ex = Explorer(1.0, [ONE], max_slowdown=3.0)
    drive(ex, memory_bound(), 20)
    assert ex.reference == ONE and ex.estimates[ONE].samples == 2
    assert not ex.estimates[DEFAULT_SETTING].aborted
    assert ex.estimates[DEFAULT_SETTING].samples == 2


def test_a_clearly_worse_probe_is_cut_short():
    ex = Explorer(1.8, [ONE])
    seen, _ = drive(ex, compute_bound(), 20)
    assert ex.estimates[ONE].aborted
    assert ex.estimates[ONE].samples == 1
    # settle + one sample: the bad setting was in force for two intervals only
    assert seen.count(ONE) == 2
    assert ex.levers == DEFAULT_SETTING


def test_already_under_target_probes_nothing():
    ex = Explorer(2.5, [ONE])
    seen, _ = drive(ex, memory_bound(), 30)
    assert set(seen) == {DEFAULT_SETTING}
    assert ONE not in ex.estimates
    assert isinstance(ex.state, Settled)
    assert ex.decision().predicted_slowdown == pytest.approx(1.0)


def test_no_steps_no_exploration():
    ex = Explorer(1.0, [ONE])
    for _ in range(20):
        ex.update(LeverSample(usage_cores=2.0, pause_fraction=0.5, steps=0))
    assert isinstance(ex.state, Waiting)
    assert ex.levers == DEFAULT_SETTING


def test_phase_change_triggers_a_new_exploration():
    ex = Explorer(1.2, [ONE])
    seen, _ = drive(ex, memory_bound(), 20)
    assert ex.levers == ONE
    seen, _ = drive(ex, compute_bound(), 30, previous=seen)
    assert ex.explorations == 2
    assert ex.levers == DEFAULT_SETTING
    assert isinstance(ex.state, Settled)
    # and to another memory-bound phase (a phase must show in steps per CPU-second or
    # in demand under the current setting to be seen: here its steps are cheaper)
    drive(ex, Model({DEFAULT_SETTING: (2.0, 200.0), ONE: (1.0, 180.0)}), 30, previous=seen)
    assert ex.explorations == 3
    assert ex.levers == ONE


def test_load_rising_over_the_target_after_settling_under_it_explores():
    ex = Explorer(1.5, [ONE])
    light = Model({DEFAULT_SETTING: (1.2, 60.0), ONE: (1.0, 55.0)})
    seen, _ = drive(ex, light, 10)
    assert ex.levers == DEFAULT_SETTING and ONE not in ex.estimates
    # same efficiency (steps per CPU-second), more demand: only the demand reveals it
    drive(ex, Model({DEFAULT_SETTING: (2.0, 100.0), ONE: (1.0, 95.0)}), 30, previous=seen)
    assert ex.explorations == 2
    assert ex.levers == ONE


def test_idle_intervals_of_a_bursty_workload_do_not_count_as_a_phase_change():
    ex = Explorer(1.0, [ONE])
    # 2 s bursts between 2 s idle waits
    drive(ex, memory_bound(), 60, busy=lambda i: 1.0 if i % 4 < 2 else 0.0)
    assert ex.explorations == 1
    assert ex.levers == ONE


def test_a_workload_that_keeps_swinging_is_not_re_probed_over_and_over():
    # Speed swings 3x every 4 intervals (a noisy neighbour): each swing looks like a phase.
    slow = Model({DEFAULT_SETTING: (2.0, 30.0), ONE: (1.0, 27.0)})
    ex = Explorer(1.0, [ONE])
    seen: list = []
    for i in range(50):
        seen, _ = drive(ex, memory_bound() if i % 2 else slow, 4, previous=seen)
    assert ex.explorations <= 5       # 3, 6, 12, 24 intervals of evidence, then calm
    assert ex.levers == ONE


def test_noisy_measurements_still_choose_right_and_stay_put():
    ex = Explorer(1.0, [ONE])
    seen, _ = drive(ex, Model(memory_bound().table, noise=0.05, seed=3), 120)
    assert ex.levers == ONE
    assert ex.explorations == 1
    assert seen[-100:] == [ONE] * 100


def test_adaptive_beats_duty_cycling_alone_on_a_memory_bound_run():
    work = 3000.0
    ex = Explorer(1.0, [ONE])
    model = memory_bound()
    seconds, done = 0, 0.0
    while done < work:
        _, steps = drive(ex, model, 1, previous=[ex.levers])
        done += steps
        seconds += 1
    duty_only = work / 50.0            # 2 cores held to 1: half speed
    assert seconds < 0.65 * duty_only  # exploration overhead included
    assert seconds < 1.05 * work / 90.0 + 5


def test_thread_axis_is_pruned_after_a_losing_count():
    table = {DEFAULT_SETTING: (8.0, 80.0)}
    table.update({LeverSetting(threads=t): (float(t), 10.0 * t) for t in (6, 4, 3, 2, 1)})
    ex = Explorer(6.0, thread_candidates(8, 6.0))
    drive(ex, Model(table), 40)
    six = LeverSetting(threads=6)
    assert ex.reference == six                 # the fewest threads at the target...
    assert DEFAULT_SETTING not in ex.estimates and LeverSetting(threads=7) not in ex.estimates
    assert LeverSetting(threads=4) in ex.estimates   # ...4 loses: fewer are not tried
    assert LeverSetting(threads=2) not in ex.estimates
    assert LeverSetting(threads=1) not in ex.estimates
    assert ex.levers == six


def test_batch_scale_is_explored_like_any_lever():
    half = LeverSetting(batch_scale=0.5)
    model = Model({DEFAULT_SETTING: (2.0, 100.0), ONE: (1.0, 50.0), half: (1.3, 95.0)})
    ex = Explorer(1.3, [ONE, half])
    drive(ex, model, 30)
    assert ex.levers == half


def test_new_target_reranks_without_probing_again():
    ex = Explorer(1.2, [ONE])
    drive(ex, memory_bound(), 20)
    assert ex.levers == ONE
    ex.set_target(1.95)
    assert ex.levers == DEFAULT_SETTING
    assert isinstance(ex.state, Settled)


def test_new_target_with_another_reference_measures_it():
    ex = Explorer(1.0, [ONE])
    drive(ex, memory_bound(), 20)
    assert set(ex.estimates) == {ONE}
    ex.set_target(1.5)   # one thread's 1.0 core is under it: start from the defaults
    assert isinstance(ex.state, Measuring) and ex.levers == DEFAULT_SETTING
    drive(ex, memory_bound(), 20, previous=[ONE])
    assert ex.levers == ONE and set(ex.estimates) == {DEFAULT_SETTING, ONE}


def test_deterministic():
    runs = []
    for _ in range(2):
        ex = Explorer(1.2, [ONE])
        seen, _ = drive(ex, Model(memory_bound().table, noise=0.1, seed=9), 50)
        runs.append((seen, ex.history))
    assert runs[0] == runs[1]


def test_the_start_up_interval_does_not_count_against_the_defaults():
    # The first interval with steps also held the imports: 1.5 cores for 10 steps.
    ex = Explorer(1.5, [ONE])
    ex.update(LeverSample(usage_cores=1.5, pause_fraction=0.0, steps=10))
    drive(ex, compute_bound(), 30)
    # Measured on clean intervals only, the defaults do 50 steps per CPU-second.
    assert ex.estimates[DEFAULT_SETTING].efficiency == pytest.approx(50.0)
    assert ex.levers == DEFAULT_SETTING


def test_measuring_discards_the_interval_after_a_change():
    ex = Explorer(1.5, [ONE], baseline_intervals=1)
    drive(ex, memory_bound(), 2)   # the start-up interval, then the baseline
    assert isinstance(ex.state, Measuring) and ex.state.levers == ONE
    assert ex.state.settle == 1
    drive(ex, memory_bound(), 1)
    assert ex.state.samples == []


def test_thread_candidates():
    assert thread_candidates(2, 1.0) == [ONE]
    assert thread_candidates(2, 1.4) == [ONE]
    # One thread would need 1.8x the work per core at a 1.8-core target: not probed.
    assert thread_candidates(2, 1.8) == []
    assert [c.threads for c in thread_candidates(8, 3.0)] == [4, 3, 2]
    assert [c.threads for c in thread_candidates(32, 20.0)] == [21, 20, 16]
    assert thread_candidates(1, 0.5) == []


@pytest.mark.parametrize("kwargs", [
    {"target_cores": 0, "candidates": []},
    {"target_cores": 1, "candidates": [DEFAULT_SETTING]},
    {"target_cores": 1, "candidates": [ONE, ONE]},
    {"target_cores": 1, "candidates": [], "baseline_intervals": 0},
    {"target_cores": 1, "candidates": [], "abort_below": 0},
])
def test_bad_configuration_is_refused(kwargs):
    with pytest.raises(ValueError):
        Explorer(**kwargs)


# ---- plugged into the agent: settings.json carries the explorer's levers ----------------

def run_agent(tmp_path, policy, model: Model | None, intervals: int = 20,
              seen: list | None = None):
    """Drive an Agent for `intervals` seconds of fake time; the workload runs `model`
    under the settings it finds (no duty cycling: none is in force with no pacing
    process), reporting steps unless `model` is None. Returns the threads published;
    `seen` gets each interval's settings and the explorer's state after it."""
    from throttledjob.contracts.progress import Progress
    from throttledjob.contracts.settings import SETTINGS_FILE, parse_settings
    from throttledjob.runtime.files import read_json_bounded
    from throttledjob.runtime.progress_files import write_progress
    from throttledjob.sidecar.agent import Agent

    now = [0.0]
    tree = FakeTree()
    agent = Agent(policy, tree, str(tmp_path), clock=lambda: now[0])
    agent.start()
    steps, published = 0.0, []
    for _ in range(intervals):
        settings = parse_settings(read_json_bounded(str(tmp_path / SETTINGS_FILE)))
        published.append(settings.threads)
        demand, rate = (model or memory_bound()).busy(LeverSetting(threads=settings.threads),
                                                      quota=1e9)[::2]
        tree.cpu += demand
        if model is not None:
            steps += rate
            write_progress(str(tmp_path), Progress(pid=os.getpid(), steps=int(steps)))
        now[0] += 1.0
        agent.cycle()
        if seen is not None:
            seen.append((settings, type(agent.choice.explorer.state).__name__
                         if agent.choice.explorer else None))
    return agent, published


def test_no_demand_is_read_past_the_cpus_the_workload_may_use():
    """Read through a deep pause, usage / (1 - pause) overshoots: a 2-thread loop on 2
    cores read 2.42 cores, and the defaults' unthrottled rate (every lever's cost) with
    it."""
    deep = LeverSample(usage_cores=0.97, pause_fraction=0.6, steps=80, cores=2)
    assert deep.demand_cores == 2
    assert LeverSample(usage_cores=0.97, pause_fraction=0.6, steps=80).demand_cores > 2
    assert Estimate.of(DEFAULT_SETTING, [deep]).peak_cores == 2


def test_a_bursts_demand_is_the_width_the_kernel_measured_not_the_intervals_average():
    """A 2-thread burst held to 1 core, then a wait, in one interval: its average over
    the interval reads 1.4 cores where the burst wanted 2 (the kernel's throttled width),
    and the defaults' unthrottled rate, every lever's cost, read low with it."""
    burst = dict(usage_cores=0.84, pause_fraction=0.4, steps=143, cores=2)
    assert LeverSample(**burst).demand_cores == pytest.approx(1.4)
    assert LeverSample(**burst, busy_width=1.95).demand_cores == 1.95
    assert LeverSample(**burst, busy_width=2.4).demand_cores == 2  # never past the CPUs
    assert Estimate.of(DEFAULT_SETTING, [LeverSample(**burst, busy_width=1.95)]) \
        .unthrottled_rate == pytest.approx(143 / 0.84 * 1.95)


def test_agent_publishes_the_explorers_threads(tmp_path):
    from throttledjob.contracts.policy import Policy

    # A budget of 2 lets the probes hold the target at no cost against it; under 1.25
    # one thread could not win (lever_gain_bound): nothing would be probed.
    agent, published = run_agent(tmp_path, Policy(cpu_peak_cores=1.0, enforcement="both",
                                                  max_slowdown=2.0), memory_bound())
    assert agent.choice.explorer is not None and agent.choice.explorer.levers == ONE
    assert published[0] is None and published[-1] == 1
    report = agent.choice.report()
    assert report["levers"] == "threads=1" and report["state"] == "Settled"
    # No duty cycling here: the defaults were read unheld, R0 as it is, one figure.
    assert report["unthrottled_steps_per_second"] == pytest.approx(100.0, rel=0.02)
    assert report["unthrottled_steps_per_second_high"] == report["unthrottled_steps_per_second"]
    result = agent.cycle()
    assert result.lever_cost_bound_seconds == pytest.approx(result.lever_cost_seconds)
    # Read held back, R0's top is one thread's 90 steps per CPU-second on the defaults'
    # 2 cores, and the agent charges one thread's time at 180/90 = 2x in the top.
    base = agent.choice.explorer.estimates[DEFAULT_SETTING]
    agent.choice.explorer.estimates[DEFAULT_SETTING] = dataclasses.replace(base, paced=True)
    assert agent.choice.report()["unthrottled_steps_per_second_high"] == \
        pytest.approx(180.0, rel=0.02)
    result = agent.cycle()
    one_busy = agent.choice.ledger.busy[ONE]
    assert result.lever_cost_seconds == pytest.approx(one_busy * (1 - 90 / 100), rel=0.03)
    assert result.lever_cost_bound_seconds == pytest.approx(
        one_busy * (1 - 1 / 2) + agent.choice.ledger.busy[DEFAULT_SETTING] * (1 - 100 / 180),
        rel=0.03)


@pytest.mark.parametrize("changes", [{"enforcement": "signals"}, {"mode": "fixed"},
                                     {"threads": 2}, {"cpu_peak_cores": None}])
def test_agent_without_an_applicable_explorer_keeps_the_policy_levers(tmp_path, changes):
    from throttledjob.contracts.policy import Policy

    policy = Policy(**{"cpu_peak_cores": 1.0, "enforcement": "both", **changes})
    agent, published = run_agent(tmp_path, policy, memory_bound())
    assert agent.choice.explorer is None
    assert set(published) == {policy.threads}


def test_agent_without_steps_never_explores(tmp_path):
    from throttledjob.contracts.policy import Policy

    agent, published = run_agent(tmp_path, Policy(cpu_peak_cores=1.0, enforcement="both"),
                                 None)
    assert agent.choice.explorer is None
    assert set(published) == {None}


STOP = LeverSetting(pacing=Pacing.STOP)


class SpinningModel(Model):
    """Two OpenMP threads: paced by sleeping the main thread, the idle worker spins on
    and burns 40% of the quota; stopped with the whole process, nothing is lost."""

    def busy(self, levers, quota, fraction=1.0):
        usage, pause, steps = super().busy(levers, quota, fraction)
        if pause and levers.pacing == "sleep" and levers.threads is None:
            steps *= 0.6
        return usage, pause, steps


def test_a_spinning_workload_is_paced_by_stopping_it():
    ex = Explorer(1.5, [STOP, ONE])
    seen, _ = drive(ex, SpinningModel(compute_bound().table), 30)
    assert ex.levers == STOP and seen[-1] == STOP
    assert ex.estimates[STOP].efficiency == pytest.approx(50.0, rel=0.02)
    assert ex.estimates[DEFAULT_SETTING].efficiency == pytest.approx(30.0, rel=0.02)


def test_the_pacing_probe_does_not_prune_thread_probes():
    # Stopping is no better than sleeping for this workload; one thread still is.
    ex = Explorer(1.2, [STOP, ONE])
    drive(ex, memory_bound(), 30)
    assert set(ex.estimates) == {DEFAULT_SETTING, STOP, ONE}
    assert ex.levers == ONE


class RecordingEnforcer:
    def __init__(self) -> None:
        self.quotas: list[float | None] = []
        self.paused_seconds = 0.0
        self.pause_capped = False

    def start(self) -> None:
        pass

    def set(self, quota, max_pause_fraction) -> None:
        self.quotas.append(quota)

    def close(self) -> None:
        pass

    error = None
    busy_width = None

    def kernel_throttling(self) -> None:
        return None


def agent_with_scripted_levers(tmp_path, levers: LeverSetting):
    """An Agent (Both, 1-core target) whose explorer is replaced by levers the test sets
    (`agent.choice.explorer.levers`); returns (agent, tree, enforcer, clock cell)."""
    import types

    from throttledjob.contracts.policy import Policy
    from throttledjob.sidecar.agent import Agent

    now, tree, enforcer = [0.0], FakeTree(), RecordingEnforcer()
    agent = Agent(Policy(cpu_peak_cores=1.0, enforcement="both"), tree, str(tmp_path),
                  enforcer=enforcer, clock=lambda: now[0])
    agent.start()
    agent.choice.explorer = types.SimpleNamespace(
        levers=levers, update=lambda sample: None, measuring=False, estimates={},
        lever_slowdown=lambda levers=None, most=False: None)
    agent.choice._steps = 0
    return agent, tree, enforcer, now


def test_agent_hands_pacing_between_stopping_and_the_runtime_without_a_gap(tmp_path):
    """Pacing by stop: the enforcer holds the quota and the runtime gets none (it would
    sleep too). Back to sleeping: the runtime gets the quota at once and the enforcer
    keeps it for one more interval, until the runtime has read it."""
    from throttledjob.contracts.progress import Progress
    from throttledjob.contracts.settings import SETTINGS_FILE, parse_settings
    from throttledjob.runtime.files import read_json_bounded
    from throttledjob.runtime.progress_files import write_progress

    agent, tree, enforcer, now = agent_with_scripted_levers(tmp_path, STOP)
    published = []
    for i, levers in enumerate([STOP, STOP, DEFAULT_SETTING, DEFAULT_SETTING, DEFAULT_SETTING]):
        agent.choice.explorer.levers = levers
        tree.cpu += 1.0
        write_progress(str(tmp_path), Progress(pid=os.getpid(), steps=100 * (i + 1)))
        now[0] += 1.0
        agent.cycle()
        settings = parse_settings(read_json_bounded(str(tmp_path / SETTINGS_FILE)))
        published.append(settings.cpu_quota_cores)
    armed = [q is not None for q in enforcer.quotas[1:]]   # [0]: start(), before any step
    assert published[:2] == [None, None] and None not in published[2:]
    assert armed == [True, True, True, False, False]


def test_a_quota_trimmed_for_cooperative_pacing_is_not_carried_over_to_stop_pacing(tmp_path):
    """Two cooperating peers under-deliver their equal shares, so the controller raises
    the quota over the setpoint; the enforcer delivers a quota exactly, so on the switch to
    stop pacing it must start from the setpoint, not from the raised quota."""
    from throttledjob.contracts.progress import Progress
    from throttledjob.runtime.progress_files import write_progress

    agent, tree, enforcer, now = agent_with_scripted_levers(tmp_path, DEFAULT_SETTING)
    for i in range(1, 12):
        if i == 11:
            agent.choice.explorer.levers = STOP
        tree.cpu += 0.8  # under the setpoint while paced: the trim winds up
        for pid in (os.getpid(), os.getppid()):
            write_progress(str(tmp_path), Progress(pid=pid, steps=10 * i,
                                                   paused_seconds=0.3 * i))
        now[0] += 1.0
        agent.cycle()
        if i == 10:
            assert agent.controller.rate > 1.1 * agent.controller.setpoint
    assert enforcer.quotas[-1] == pytest.approx(agent.controller.setpoint)


def test_probe_order_puts_thread_counts_that_need_no_duty_cycling_first():
    assert probe_order(2, 0.9, stop_pacing=True) == [ONE, STOP]
    assert probe_order(2, 1.4, stop_pacing=True) == [STOP, ONE]
    assert probe_order(2, 1.4, stop_pacing=False) == [ONE]
    assert [c.threads for c in probe_order(8, 3.0, stop_pacing=True)] == [4, 3, None, 2]


def test_after_a_winning_first_probe_a_worse_one_is_cut_short():
    ex = Explorer(1.5, probe_order(2, 1.5, stop_pacing=True))
    seen, _ = drive(ex, SpinningModel(compute_bound().table), 30)
    assert ex.levers == STOP
    assert ex.estimates[ONE].aborted and seen.count(ONE) == 2


@pytest.mark.parametrize("model", [compute_bound(), memory_bound(),
                                   SpinningModel(compute_bound().table)])
def test_at_a_target_of_one_core_one_thread_is_all_there_is_to_measure(model):
    # One thread needs no duty cycling at 1 core; two threads held to 1 core do fewer
    # steps per CPU-second unless they scale better than linearly: nothing to probe.
    ex = Explorer(0.9, probe_order(2, 0.9, stop_pacing=True))
    seen, _ = drive(ex, model, 30)
    assert seen[0] == DEFAULT_SETTING and set(seen[1:]) == {ONE}
    assert set(ex.estimates) == {ONE} and isinstance(ex.state, Settled)
    assert ex.explorations == 1


def test_one_thread_under_the_target_still_measures_the_defaults():
    # Light load: one thread wants 0.5 core of a 0.7 target; two use the headroom.
    light = Model({DEFAULT_SETTING: (0.8, 80.0), ONE: (0.5, 50.0)})
    ex = Explorer(0.7, probe_order(2, 0.7, stop_pacing=True))
    drive(ex, light, 30)
    assert ex.reference == ONE and DEFAULT_SETTING in ex.estimates
    assert ex.levers == DEFAULT_SETTING


@pytest.mark.parametrize("peers", [1, 2])
def test_partly_idle_intervals_raise_the_quota_only_for_peers_sharing_it(tmp_path, peers):
    """A bursty loop paced by the runtime: each interval half busy (paced), half idle, so
    usage sits under the setpoint while pacing binds. One process gets exactly its quota:
    raising it would only let the next burst past the target (bursty p99 0.63 against a
    0.555 target before this). Peers get equal shares they may use unequally: for them the
    shortfall can be the actuator's own, and the quota may rise."""
    from throttledjob.contracts.policy import Policy
    from throttledjob.contracts.progress import Progress
    from throttledjob.runtime.progress_files import write_progress
    from throttledjob.sidecar.agent import Agent

    now, tree = [0.0], FakeTree()
    agent = Agent(Policy(cpu_peak_cores=1.0, enforcement="cooperative", threads=1),
                  tree, str(tmp_path), clock=lambda: now[0])
    agent.start()
    pids = [os.getpid(), os.getppid()][:peers]
    for i in range(1, 21):
        tree.cpu += 0.5
        for pid in pids:
            write_progress(str(tmp_path), Progress(pid=pid, steps=10 * i,
                                                   paused_seconds=0.25 * i))
        now[0] += 1.0
        agent.cycle()
    setpoint = agent.controller.setpoint
    if peers == 1:
        assert agent.controller.rate == pytest.approx(setpoint)
    else:
        assert agent.controller.rate > 1.2 * setpoint


def test_a_bursty_workload_held_back_by_the_quota_wants_the_target():
    # Half of each interval idle: the interval's average demand (0.57 at the defaults,
    # 0.44 at one thread) looks under a 0.8-core target, but the quota held the busy half
    # back, so one thread is at the target and dominates the defaults and stop pacing.
    ex = Explorer(0.8, [ONE, LeverSetting(pacing=Pacing.STOP)])
    seen, _ = drive(ex, compute_bound(), 20, busy=lambda i: 0.5)
    assert isinstance(ex.state, Settled) and ex.levers == ONE
    assert set(ex.estimates) == {ONE}            # nothing else measured
    assert seen.count(DEFAULT_SETTING) == 1       # the start-up interval only


# --- the slowdown budget: a lever's own cost counts ------------------------------------------

def test_under_a_budget_a_lever_that_costs_speed_by_itself_loses_to_a_lifted_quota():
    # One thread of a compute-bound loop halves its speed: no pause shows that cost. At a
    # 0.9-core target, holding the defaults would take 2.2x as long; the 1.25 budget lifts
    # their quota to 1.6 cores (1.25x), which one thread can never match.
    ex = Explorer(0.9, probe_order(2, 0.9, stop_pacing=True), max_slowdown=1.25)
    drive(ex, compute_bound(), 30, quota=1.6)
    assert DEFAULT_SETTING in ex.estimates  # R0 is the defaults': always measured
    assert isinstance(ex.state, Settled) and ex.levers == DEFAULT_SETTING
    assert ex.rate_for(ex.estimates[DEFAULT_SETTING]) == pytest.approx(1.6, rel=0.03)
    assert ex.decision().predicted_slowdown == pytest.approx(1.25, rel=0.03)
    assert ex.lever_slowdown() == pytest.approx(1.0)
    # Without the budget the same measurements rank one thread first (as fast as the
    # defaults held to 0.9 cores, and the reference): the 2x it costs is invisible.
    blind = Explorer(0.9, probe_order(2, 0.9, stop_pacing=True))
    drive(blind, compute_bound(), 30)
    assert blind.levers == ONE


def test_under_a_budget_a_cheap_lever_still_wins_and_its_cost_is_known():
    # Memory-bound: one thread keeps 90% of the speed on half the cores.
    ex = Explorer(1.0, probe_order(2, 1.0, stop_pacing=True), max_slowdown=1.25)
    drive(ex, memory_bound(), 30)
    assert ex.levers == ONE
    assert ex.lever_slowdown() == pytest.approx(100 / 90, rel=0.02)
    assert ex.decision().predicted_slowdown == pytest.approx(100 / 90, rel=0.02)


class QuotaWaste(Model):
    """A kernel quota holding several synchronised threads back makes them waste CPU: a
    fifth of the steps of the defaults held back are lost (one thread wastes none)."""

    def busy(self, levers: LeverSetting, quota: float, fraction: float = 1.0) -> tuple[float, ...]:
        usage, pause, steps = super().busy(levers, quota, fraction)
        return usage, pause, steps * (0.8 if pause > 0 and levers.threads is None else 1.0)


def test_the_most_a_lever_can_cost_covers_an_unthrottled_rate_read_low_under_the_quota():
    # Compute-bound: one thread of two really costs 2x. Held to 1 core, the defaults
    # waste a fifth, so R0 reads 80 steps/s and one thread's cost 1.6x; the estimate's top
    # takes R0 at one thread's steps per CPU-second over the defaults' cores: 2x.
    model = QuotaWaste(compute_bound().table)
    ex = Explorer(1.0, [ONE], max_slowdown=3)   # a budget: the defaults are measured
    drive(ex, model, 20)
    assert {DEFAULT_SETTING, ONE} <= set(ex.estimates) and ex.estimates[DEFAULT_SETTING].paced
    assert ex.lever_slowdown(ONE) == pytest.approx(1.6, rel=0.02)
    assert ex.lever_slowdown(ONE, most=True) == pytest.approx(2.0, rel=0.02)
    # The defaults themselves, held: up to 1.25x slower than their pause alone says.
    assert ex.lever_slowdown(DEFAULT_SETTING) == 1.0
    assert ex.lever_slowdown(DEFAULT_SETTING, most=True) == pytest.approx(1.25, rel=0.02)
    # Measured unheld (the target over the demand), R0 is as read: no interval.
    free = Explorer(2.5, [ONE], max_slowdown=1.25)
    free.estimates[DEFAULT_SETTING] = Estimate(DEFAULT_SETTING, 50.0, 2.0, 2)
    free.estimates[ONE] = Estimate(ONE, 60.0, 1.0, 2)
    assert free.unthrottled_rate_high() == free.unthrottled_rate() == 100.0
    # Held, only a cap measured with no waste witnesses: not 3 threads of 4 held (they
    # waste too), nor a smaller batch (its steps are smaller), nor the defaults stopped.
    held = Explorer(2.5, [], max_slowdown=1.25)
    held.estimates[DEFAULT_SETTING] = Estimate(DEFAULT_SETTING, 50.0, 4.0, 2, paced=True)
    for levers in (LeverSetting(threads=3), LeverSetting(batch_scale=0.5),
                   LeverSetting(pacing=Pacing.STOP)):
        held.estimates[levers] = Estimate(levers, 70.0, 3.0, 2, paced=True)
    assert held.unthrottled_rate_high() == held.unthrottled_rate() == 200.0
    held.estimates[LeverSetting(threads=3)] = Estimate(LeverSetting(threads=3), 60.0, 2.4, 2)
    assert held.unthrottled_rate_high() == 240.0     # that cap, unheld
    held.estimates[ONE] = Estimate(ONE, 65.0, 1.0, 2, paced=True)
    assert held.unthrottled_rate_high() == 260.0     # one thread, held or not


def test_no_thread_count_can_beat_a_budget_that_lifts_the_defaults_past_it():
    # torch_train.py at a 1-core target: two threads want 2 cores; the 1.25 budget lifts
    # them to 1.6, and one thread, at most 1.5x the work per core, cannot match that.
    assert lever_gain_bound([ONE], 2.0, 1.0, 1.25) == pytest.approx(1 - 1.6 / 1.5)
    # read at 1.8 cores (as under the quota) it can save 4% at most
    assert lever_gain_bound([ONE], 1.8, 1.0, 1.25) == pytest.approx(0.04)
    # held at 1 core (a budget that does not bind, or none): a third
    assert lever_gain_bound([ONE], 2.0, 1.0, 3.0) == pytest.approx(1 / 3)
    assert lever_gain_bound([ONE], 2.0, 1.0, None) == pytest.approx(1 / 3)
    # a setting other than a thread count has no such bound
    assert lever_gain_bound([ONE, LeverSetting(pacing=Pacing.STOP)], 2.0, 1.0, 1.25) is None
    assert lever_gain_bound([ONE, LeverSetting(batch_scale=0.5)], 2.0, 1.0, 1.25) is None


def test_what_an_exploration_costs_against_the_budgets_lift():
    # 7 s held at 1 core, where the defaults take 2x, instead of the budget's 1.25x
    assert exploration_cost(7.0, 2.0, 1.0, 1.25) == pytest.approx(7 * (1 - 1.25 / 2))
    assert exploration_cost(7.0, 1.2, 1.0, 1.25) == 0.0   # the target within the budget
    assert exploration_cost(7.0, 2.0, 1.0, 3.0) == 0.0    # no lift: held anyway
    assert exploration_cost(7.0, 2.0, 1.0, None) == 0.0


def test_an_exploration_runs_once_the_time_expected_left_repays_it():
    assert worth_exploring(1.0, 0.0, 0.0)             # costs nothing
    assert worth_exploring(0.0, 5.0, None)            # no bound: as before
    assert not worth_exploring(10.0, 2.0, 0.1) and worth_exploring(20.0, 2.0, 0.1)
    # a gain of 4% or less (none included) counts as 4%: the cost is then 2% of 2t
    assert not worth_exploring(65.0, 2.625, -0.07) and worth_exploring(66.0, 2.625, -0.07)
    assert worth_exploring(66.0, 2.625, 0.01) == worth_exploring(66.0, 2.625, 0.04)


def torch_like() -> Model:
    # examples/torch_train.py on this machine (bench/out/estimate.json): one thread does
    # 1.3-1.46x the steps per CPU-second of two.
    return Model({DEFAULT_SETTING: (2.0, 100.0), ONE: (1.0, 70.0)})


def test_where_no_thread_count_can_win_under_the_budget_nothing_is_probed():
    ex = Explorer(1.0, [ONE], max_slowdown=1.25)
    seen, _ = drive(ex, torch_like(), 30, quota=1.6)
    assert isinstance(ex.state, Waiting) and ex.estimates == {} and not ex.measuring
    assert set(seen) == {DEFAULT_SETTING}
    assert ex.exploration_intervals == 7
    # With room in the budget the same workload explores once its demand is read past
    # start-up (at once where even all the cores could not stop one thread winning),
    # and one thread wins.
    roomy = Explorer(1.0, [ONE], max_slowdown=3.0)
    seen, _ = drive(roomy, torch_like(), 30)
    assert seen.index(ONE) == 2 and roomy.levers == ONE
    at_once = Explorer(1.0, [ONE], max_slowdown=3.0)
    at_once.update(LeverSample(2.0, 0.5, 50.0, cores=2))
    assert at_once.measuring and at_once.levers == ONE


def test_the_demand_that_decides_is_read_past_the_first_steps():
    # The first interval with steps is mostly start-up: it reads 0.6 cores, under which
    # one thread could win; the next reads the 2 cores the defaults want, and nothing is
    # probed.
    ex = Explorer(1.0, [ONE], max_slowdown=1.25)
    seen, _ = drive(ex, torch_like(), 10, quota=1.6, busy=lambda i: 0.3 if i == 0 else 1.0)
    assert set(seen) == {DEFAULT_SETTING} and isinstance(ex.state, Waiting)


def test_a_dip_in_demand_does_not_set_a_probe_going():
    # The run's last interval read 1.37 cores of the 1.5-1.9 before it (bench.probes
    # --pay-off 600): at 1.37 a probe would pay; the most demand read decides.
    ex = Explorer(1.0, [ONE], max_slowdown=1.25)
    for usage in (1.0, 1.8, 1.9, 1.8, 1.37):
        ex.update(LeverSample(usage, 0.0, 100.0, cores=2))
    assert isinstance(ex.state, Waiting) and ex.state.peak == 1.9


def test_a_long_run_explores_anyway_and_finds_a_lever_the_bound_said_could_not_win():
    # Memory-bound past the bound: one thread does 1.8x the work per core of two, and
    # holds 1 core at 1.11x. Nothing is probed for the first 65 s; then the exploration
    # runs, as insurance, and finds it.
    ex = Explorer(1.0, [ONE], max_slowdown=1.25)
    seen, _ = drive(ex, memory_bound(), 90, quota=1.6)
    first = seen.index(ONE)
    assert 65 <= first <= 67, first
    assert isinstance(ex.state, Settled) and ex.levers == ONE


def test_a_budget_that_does_not_bind_changes_nothing():
    for model, target in ((memory_bound(), 1.2), (compute_bound(), 1.5)):
        with_budget = Explorer(target, [ONE], max_slowdown=4.0)
        without = Explorer(target, [ONE])
        drive(with_budget, model, 30)
        drive(without, model, 30)
        assert with_budget.levers == without.levers
        assert with_budget.rate_for(with_budget.estimates[with_budget.levers]) == target


def test_the_agent_charges_a_levers_own_cost_to_the_slowdown_and_the_budget(tmp_path):
    """One thread keeps 90% of the speed: no pause shows the 10% it costs. The report's
    slowdown counts it, and the duty cycle gets only what the budget leaves after it."""
    from throttledjob.contracts.policy import Policy
    from throttledjob.sidecar.summary import summarize

    policy = Policy(cpu_peak_cores=1.0, enforcement="both", max_slowdown=2.0)
    agent, published = run_agent(tmp_path, policy, memory_bound(), intervals=40)
    assert published[-1] == 1 and agent.choice.explorer.lever_slowdown() == pytest.approx(
        100 / 90, rel=0.02)
    summary = summarize(agent.result)
    assert summary.paused_seconds == 0  # nothing paused: the model ran free
    # Most of the run was under one thread: its cost shows in the slowdown, for every
    # interval run under it, those before the defaults were measured (the reference is
    # one thread, measured first) included.
    one_busy = sum((1 - s.pause_fraction) * s.elapsed_seconds
                   for levers, s in agent.choice.explorer.trace if levers == ONE)
    assert agent.result.lever_cost_seconds == pytest.approx(one_busy * (1 - 0.9), rel=0.03)
    assert 1.05 < summary.slowdown < 100 / 90 + 0.01, summary
    # 2 / 1.111 leaves a 1.8x budget for pausing: at most 44% of the time.
    assert agent._max_pause_fraction() == pytest.approx(1 - (100 / 90) / 2, rel=0.02)
    assert policy.max_pause_fraction == pytest.approx(0.5)


def test_the_agent_explores_with_the_policys_budget(tmp_path):
    """A compute-bound workload at a 1-core target: one thread would take 2x, which the
    budget forbids; the defaults stay, and the budget holds by pausing alone. With the
    default budget (1.25) no thread count can win (lever_gain_bound): nothing is probed.
    With 1.6 one may save a sixth: both are measured (once the run has lasted long
    enough to repay the probes, 8.4 s: worth_exploring), and the defaults win."""
    from throttledjob.contracts.policy import Policy

    agent, published = run_agent(tmp_path, Policy(cpu_peak_cores=1.0, enforcement="both"),
                                 compute_bound(), intervals=40)
    assert agent.choice.explorer.max_slowdown == 1.25
    explorer = agent.choice.explorer
    assert explorer.estimates == {} and isinstance(explorer.state, Waiting)
    assert set(published) == {None} and agent.result.probe_seconds == 0
    (tmp_path / "wider").mkdir()
    agent, published = run_agent(tmp_path / "wider", Policy(
        cpu_peak_cores=1.0, enforcement="both", max_slowdown=1.6), compute_bound(),
        intervals=40)
    assert set(agent.choice.explorer.estimates) == {DEFAULT_SETTING, ONE}
    assert published[-1] is None and agent.choice.explorer.levers == DEFAULT_SETTING


def test_time_under_a_setting_whose_cost_is_not_known_yet_is_reported(tmp_path):
    """A run that ends while the reference (one thread) ran and the defaults were not
    measured yet cannot know what one thread cost: the report says how long it ran so,
    rather than print an estimate that leaves it out as if it were free."""
    from throttledjob.contracts.policy import Policy

    policy = Policy(cpu_peak_cores=1.0, enforcement="both", max_slowdown=2.0)
    for run in ("short", "long"):
        (tmp_path / run).mkdir()
    short, published = run_agent(tmp_path / "short", policy, memory_bound(), intervals=4)
    assert DEFAULT_SETTING not in short.choice.explorer.estimates
    one_busy = sum((1 - s.pause_fraction) * s.elapsed_seconds
                   for levers, s in short.choice.explorer.trace if levers == ONE)
    assert one_busy > 0 and published.count(1) >= 2
    assert short.result.lever_cost_unknown_seconds == pytest.approx(one_busy)
    assert short.result.lever_cost_seconds == 0.0
    # Once the defaults are measured the cost is known, and charged for all that time.
    long, _ = run_agent(tmp_path / "long", policy, memory_bound(), intervals=40)
    assert long.result.lever_cost_unknown_seconds == 0.0
    assert long.result.lever_cost_seconds > 0


def test_the_explorers_measurements_hold_the_target_off_the_budgets_books(tmp_path):
    """The defaults of a compute-bound workload need 2x to hold a 1-core target, past the
    1.25 budget. Measured under the budget, the probe lifted the rate and the peak with
    it; it is measured with the target held (`probing`, at most PROBE_HOLD_INTERVALS per
    setting) and budgeted again once the explorer settles."""
    from throttledjob.contracts.policy import Policy
    from throttledjob.sidecar.cpu.lever_choice import PROBE_HOLD_INTERVALS

    seen = []
    # 1.6, not the default 1.25: under 1.25 no thread count could win, nothing would be
    # probed.
    agent, _ = run_agent(tmp_path, Policy(cpu_peak_cores=1.0, enforcement="both",
                                          max_slowdown=1.6),
                         compute_bound(), intervals=30, seen=seen)
    assert DEFAULT_SETTING in agent.choice.explorer.estimates  # the defaults were probed
    # the settings an interval ran under were published after the previous state
    states = [None] + [state for _, state in seen[:-1]]
    probing = [settings.probing for settings, _ in seen]
    assert probing == [state == "Measuring" for state in states], (probing, states)
    assert 0 < sum(probing) <= PROBE_HOLD_INTERVALS * (1 + len(agent.choice.explorer.estimates))
    assert all(settings.max_pause_fraction == pytest.approx(1 - 1 / 1.6)
               for settings, _ in seen)
    assert agent.result.probe_seconds == sum(probing)


def test_a_measurement_stalled_by_idle_intervals_is_budgeted_again(tmp_path):
    """Idle intervals tell the explorer nothing, so a measurement can last: the hold
    ends after PROBE_HOLD_INTERVALS of it, and the budget applies again."""
    from throttledjob.contracts.policy import Policy
    from throttledjob.sidecar.cpu.lever_choice import PROBE_HOLD_INTERVALS

    class StallsAfterStart(Model):
        def busy(self, levers, quota):
            self.calls = getattr(self, "calls", 0) + 1
            return compute_bound().busy(levers, quota) if self.calls <= 2 else (0.0, 0, 0.0)

    seen = []
    run_agent(tmp_path, Policy(cpu_peak_cores=1.0, enforcement="both", max_slowdown=2.0),
              StallsAfterStart({}), intervals=PROBE_HOLD_INTERVALS + 6, seen=seen)
    assert seen[-1][1] == "Measuring"  # still waiting for a busy interval
    probing = [settings.probing for settings, _ in seen]
    assert 0 < sum(probing) <= PROBE_HOLD_INTERVALS and not probing[-1]


def test_the_first_interval_under_the_setting_the_probes_chose_is_held_too(tmp_path):
    """The probes end on the defaults and settle on one thread: the first interval under
    it is held at the target as the probes were (the quota's last width is the
    defaults', and the budget's floor read from it would lift one thread past the
    target); the next is the budget's again."""
    from throttledjob.contracts.policy import Policy

    seen: list = []
    run_agent(tmp_path, Policy(cpu_peak_cores=1.0, enforcement="both", max_slowdown=2.0),
              memory_bound(), intervals=20, seen=seen)
    settled = [state for _, state in seen].index("Settled")
    assert seen[settled][0].threads is None  # the defaults, measured last
    after, then = seen[settled + 1][0], seen[settled + 2][0]
    assert after.threads == 1 and after.probing
    assert then.threads == 1 and not then.probing


def test_the_explorer_reads_steps_at_the_rate_the_runtime_counted_them(tmp_path):
    """The runtime writes its step count every half second, not at the sidecar's cycle:
    counted per cycle, a steady 100 steps/s read 50 and 150 by turns (a setting measured
    over two such intervals read 25% slow). Read over the writes' own clock, every
    interval reads 100."""
    from throttledjob.contracts.policy import Policy
    from throttledjob.contracts.progress import Progress
    from throttledjob.runtime.progress_files import write_progress
    from throttledjob.sidecar.agent import Agent

    now, tree = [0.0], FakeTree()
    agent = Agent(Policy(cpu_peak_cores=1.0, enforcement="both"), tree, str(tmp_path),
                  clock=lambda: now[0])
    agent.start()
    written = 1000.0  # the Unix time of the last write
    for i in range(12):
        # One write half a second into the interval, and, every other interval, a
        # second one at its very end, behind the cycle's read.
        writes = [0.5, 1.0] if i % 2 else [0.5]
        for at in writes:
            written = 1000.0 + i + at
            write_progress(str(tmp_path), Progress(pid=os.getpid(), steps=int(
                100 * (written - 1000.0)), time=written))
        tree.cpu += 2.0
        now[0] += 1.0
        agent.cycle()
    read = [s.steps for _, s in agent.choice.explorer.trace if s.steps]
    assert len(read) >= 8
    assert all(s == pytest.approx(100, rel=0.02) for s in read), read
