"""The three parts of a control cycle, each on its own: measure (a Meter over a tree and
the shared directory), decide (hand-made samples), act (the settings file and the
enforcer, as the plan says)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace

import psutil
import pytest

from testing.fake_tree import FakeTree
from throttledjob.contracts.policy import Enforcement, Policy
from throttledjob.contracts.progress import Progress
from throttledjob.contracts.settings import SETTINGS_FILE
from throttledjob.runtime.progress_files import write_progress
from throttledjob.sidecar.cpu.act import COOPERATION_TIMEOUT_INTERVALS, Actuator
from throttledjob.sidecar.cpu.controller import CpuController
from throttledjob.sidecar.cpu.decide import KERNEL_PAUSE_SLACK, budget_reason, decide, gpu_rate
from throttledjob.sidecar.cpu.enforcement import plan_as_written, pod_plan
from throttledjob.sidecar.cpu.lever_settings import LeverSetting, Pacing
from throttledjob.sidecar.cpu.measure import (
    Meter,
    ProgressClock,
    Sample,
    progress_clock,
    steps_in_interval,
)


def sample(usage: float = 1.0, coop: float = 0.0, signal: float = 0.0,
           capped: bool = False, elapsed: float = 1.0) -> Sample:
    return Sample(time=elapsed, elapsed=elapsed, cpu_seconds=usage * elapsed,
                  used_seconds=usage * elapsed, records=(), steps=0, new_steps=0,
                  cooperative_pause=coop, cooperative_capped=capped, signal_pause=signal,
                  enforcer_capped=False, kernel_pause=0.0)


class Enforcer:
    """Records what the actuator asked of it."""

    paused_seconds = 0.0
    pause_capped = False
    busy_width = None

    def __init__(self) -> None:
        self.calls: list[tuple[float | None, float]] = []

    def set(self, rate: float | None, max_pause: float) -> None:
        self.calls.append((rate, max_pause))


def test_steps_are_read_over_the_writers_cpu_clock_so_a_wait_between_writes_does_not_thin_them():
    """A 2-thread loop steps 300 times in a 0.5 s burst (1 CPU-second), then waits 1 s.
    Over the wall clock between the writes its rate read 200 steps/s, as if it stepped
    through the wait: 200 steps for an interval that used one CPU-second on 300. Over the
    CPU the writers used it reads 300, whatever helpers beside them used (a data loader's
    workers are in the tree's CPU, not the writers'); the wall clock serves where the CPU
    clock cannot."""
    me = frozenset({1})
    before = ProgressClock(100.0, 10.0, me, cycle_cpu_seconds=10.2)
    after = ProgressClock(101.5, 11.0, me, cycle_cpu_seconds=11.2)
    assert steps_in_interval(300, before, after, elapsed=1.0) == pytest.approx(300)
    # Half the writers' CPU between the writes fell in this interval: half the steps.
    assert steps_in_interval(300, before, replace(after, cycle_cpu_seconds=10.7),
                             elapsed=1.0) == pytest.approx(150)
    # An older runtime writes no CPU clock; another process came meanwhile.
    old = replace(before, cpu_seconds=0.0), replace(after, cpu_seconds=0.0)
    assert steps_in_interval(300, *old, elapsed=1.0) == 200
    joined = replace(after, cpu_seconds=13.0, pids=frozenset({1, 2}))
    assert steps_in_interval(300, before, joined, elapsed=1.0) == 200
    # No clock moved (the first write): the count as it is.
    first = ProgressClock(0.0, 0.0, me)
    assert steps_in_interval(300, first, first, elapsed=1.0) == 300


def test_the_meter_turns_counters_into_an_intervals_rates(tmp_path) -> None:
    tree = FakeTree()
    meter = Meter(tree, str(tmp_path), now=0.0)
    me = os.getpid()  # a live process: only live processes' records count as cooperating
    write_progress(str(tmp_path), Progress(pid=me, steps=10, paused_seconds=0.0))
    tree.cpu = 1.5
    first = meter.measure(2.0, None)
    assert first.usage_cores == pytest.approx(0.75) and first.elapsed == 2.0
    assert first.steps == first.new_steps == 10 and first.cooperating == [me]
    assert first.cooperative_pause == 0.0  # the first record is the baseline
    # The writers' own CPU at the cycle, on the clock the runtime writes (process_time).
    assert progress_clock(first.records).cycle_cpu_seconds == pytest.approx(
        time.process_time(), abs=0.05)
    write_progress(str(tmp_path), Progress(pid=me, steps=25, paused_seconds=0.5))
    enforcer = Enforcer()
    enforcer.paused_seconds = 0.6
    enforcer.busy_width = 1.8  # a kernel quota's: its tree wanted 1.8 cores when busy
    tree.cpu = 2.0
    second = meter.measure(3.0, enforcer)
    # It held the tree back in this interval, more than pacing did: its width stands.
    assert second.busy_width == 1.8
    assert second.usage_cores == pytest.approx(0.5)
    assert (second.steps, second.new_steps) == (25, 15)
    assert second.cooperative_pause == pytest.approx(0.5)
    assert second.signal_pause == pytest.approx(0.6)
    assert second.pause_fraction == pytest.approx(0.6)  # the larger, not the sum
    assert meter.cooperative_paused_seconds == pytest.approx(0.5)
    # A process's count survives it: its file gone, its steps still count.
    os.unlink(tmp_path / f"progress-{me}.json")
    third = meter.measure(4.0, enforcer)
    assert third.steps == 25 and third.new_steps == 0 and third.records == ()
    assert third.busy_width is None  # not held back in this one: no width is claimed


def test_a_decision_follows_the_controller_and_the_budget() -> None:
    controller = CpuController(1.0, margin=0.0)
    held = decide(sample(usage=1.3, coop=0.3), controller, pacing_by_peers=False,
                  was_gpu_bound=False, gpu_duty=None, gpu_exhausted=False)
    assert held.throttling and not held.budget_exhausted and not held.gpu_bound
    assert held.rate_cores == pytest.approx(controller.rate) and held.rate_cores < 1.0
    # The budget refused the pause the rate wanted while the workload was over target.
    capped = decide(sample(usage=1.3, coop=0.2, capped=True), controller,
                    pacing_by_peers=False, was_gpu_bound=False, gpu_duty=None,
                    gpu_exhausted=False)
    assert capped.budget_exhausted and capped.rate_cores == held.rate_cores  # no wind-down


def test_the_budget_verdict_is_one_rule_for_every_way_a_target_is_out_of_reach() -> None:
    """decide.budget_reason: either controller capped by the budget while over its
    target, a limit over the target wanted, or the containers' limit holding the
    workload back past the budget (beyond the kernel's slack); each says which."""
    assert budget_reason(False, False, 0.2, 0.2, None) is None
    assert budget_reason(False, False, 0.2 + KERNEL_PAUSE_SLACK, 0.2, None) is None
    assert "holds the workload back 22% of the time" in budget_reason(
        False, False, 0.2 + 2 * KERNEL_PAUSE_SLACK, 0.2, None)
    assert "the CPU is still over its target" in budget_reason(True, False, 0.0, 0.2, None)
    assert "the GPU is still over its target" in budget_reason(False, True, 0.0, 0.2, None)
    assert "CPU limit at 1.60 cores" in budget_reason(False, False, 0.0, 0.2, 1.6)
    # decide() gives the same verdict: a kernel pause of 0.5 against a budget of 0.2.
    held = decide(sample(usage=0.5, coop=0.0), None, pacing_by_peers=False,
                  was_gpu_bound=False, gpu_duty=None, gpu_exhausted=False,
                  max_pause_fraction=0.2)
    assert not held.budget_exhausted and held.budget_reason is None
    over = decide(replace(sample(usage=0.5, coop=0.0), kernel_pause=0.5), None,
                  pacing_by_peers=False, was_gpu_bound=False, gpu_duty=None,
                  gpu_exhausted=False, max_pause_fraction=0.2)
    assert over.budget_exhausted and "50% of the time" in over.budget_reason


def test_the_gpu_duty_becomes_the_rate_where_it_is_the_lower_one() -> None:
    # 1 core used while held back half the time: 2 cores wanted; a duty of 0.75 leaves
    # a quarter of that, 0.5 core, under the CPU target's 1.0.
    s = sample(usage=1.0, coop=0.5)
    assert gpu_rate(s, 0.75) == pytest.approx(0.5)
    d = decide(s, CpuController(1.0, margin=0.0), pacing_by_peers=False,
               was_gpu_bound=False, gpu_duty=0.75, gpu_exhausted=True)
    assert d.gpu_bound and d.rate_cores == pytest.approx(0.5) and d.budget_exhausted
    # Without a CPU target the GPU's rate is the only one.
    alone = decide(s, None, pacing_by_peers=False, was_gpu_bound=False, gpu_duty=0.75,
                   gpu_exhausted=False)
    assert alone.gpu_bound and alone.rate_cores == pytest.approx(0.5)
    # While the GPU held the workload back, the CPU controller does not read that pause
    # as its own: it leaves its rate where it was instead of winding it up.
    controller = CpuController(1.0, margin=0.0)
    decide(sample(usage=0.4, coop=0.6), controller, pacing_by_peers=True,
           was_gpu_bound=True, gpu_duty=0.75, gpu_exhausted=False)
    assert controller.rate == 1.0


def read_settings(directory) -> dict:
    return json.loads((directory / SETTINGS_FILE).read_text())


def test_act_paces_or_holds_as_the_plan_says(tmp_path) -> None:
    policy = Policy(cpu_peak_cores=1.0, enforcement=Enforcement.BOTH)
    both = plan_as_written(policy)
    actuator, enforcer = Actuator(str(tmp_path)), Enforcer()
    # In Both, a workload that calls step() is paced, the enforcer disarmed ...
    acted = actuator.act(0.9, policy, both, LeverSetting(), 0.2, enforcer, idle_seconds=0.0,
                         now=1.0)
    assert acted.paced and not acted.enforcer_armed and enforcer.calls[-1] == (None, 0.2)
    assert read_settings(tmp_path)["cpu_quota_cores"] == 0.9
    # ... one silent for COOPERATION_TIMEOUT_INTERVALS is held by the enforcer, with the
    # rate still published for the moment it calls step() again.
    idle = COOPERATION_TIMEOUT_INTERVALS * policy.interval_seconds + 0.1
    acted = actuator.act(0.9, policy, both, LeverSetting(), 0.2, enforcer, idle, now=2.0)
    assert acted.paced and acted.enforcer_armed and enforcer.calls[-1] == (0.9, 0.2)
    # Stopping chosen by the explorer: the enforcer holds, nothing is paced, and it
    # stays armed the interval after pacing comes back (the runtime's next check).
    stop = LeverSetting(pacing=Pacing.STOP)
    acted = actuator.act(0.9, policy, both, stop, 0.2, enforcer, 0.0, now=3.0)
    assert not acted.paced and acted.enforcer_armed
    assert read_settings(tmp_path)["cpu_quota_cores"] is None
    acted = actuator.act(0.9, policy, both, LeverSetting(), 0.2, enforcer, 0.0, now=4.0)
    assert acted.paced and acted.enforcer_armed
    # In a pod under Quota the containers' limit holds: pacing only, no enforcer.
    quota = Policy(cpu_peak_cores=1.0, enforcement=Enforcement.QUOTA)
    acted = actuator.act(0.9, quota, pod_plan(quota, 1.0), LeverSetting(), 0.2, None, 0.0, 5.0)
    assert acted.paced and not acted.enforcer_armed
    assert read_settings(tmp_path)["seq"] == 5


def test_a_settings_file_that_cannot_be_written_is_an_error_not_a_crash(tmp_path) -> None:
    policy = Policy(cpu_peak_cores=1.0, enforcement=Enforcement.SIGNALS)
    enforcer = Enforcer()
    acted = Actuator(str(tmp_path / "missing")).act(
        0.9, policy, plan_as_written(policy), LeverSetting(), 0.2, enforcer, 0.0, 1.0)
    assert acted.error and acted.error.startswith("cannot write settings")
    assert acted.enforcer_armed and enforcer.calls == [(0.9, 0.2)]  # signals still hold


def test_the_workloads_cpu_counter_never_goes_down(tmp_path) -> None:
    """A process that leaves the tree unreaped (in a pod: a container that exits) takes
    its CPU time out of the tree's sum; the counter Prometheus reads stays monotonic,
    else rate() reads a reset and a spike of the whole total."""
    tree = FakeTree()
    meter = Meter(tree, str(tmp_path), now=0.0)
    seen = []
    for now, cpu in ((1.0, 30.0), (2.0, 60.0), (3.0, 31.0), (4.0, 32.0)):
        tree.cpu = cpu
        meter.measure(now, None)
        seen.append(meter.cpu_seconds)
    assert seen == [30.0, 60.0, 60.0, 61.0]


def test_steps_keep_counting_past_the_processes_the_meter_keeps(tmp_path) -> None:
    """A pipeline that starts a stepping process per task, 1,500 in all, 100 at a time:
    each one's steps count once, past the 1,024 whose counts the meter keeps (the count
    stopped there)."""
    from throttledjob.sidecar.cpu.measure import MAX_STEP_PIDS

    meter = Meter(FakeTree(), str(tmp_path), now=0.0)
    # Pids no process has here (under pid_max, so the parser takes them): each task gone.
    pids = iter(range(3_000_000, 4_000_000))
    tasks = 0
    for interval in range(1, 16):
        for _ in range(100):
            pid = next(pids)
            while psutil.pid_exists(pid):
                pid = next(pids)
            write_progress(str(tmp_path), Progress(pid=pid, steps=3, paused_seconds=0.0))
            tasks += 1
        sample = meter.measure(float(interval), None)
        assert sample.steps == 3 * tasks and sample.new_steps == 300
    assert tasks > MAX_STEP_PIDS
