"""One summary of a run for /status and --report: the same peaks, time held back,
slowdown and levers, from the agent's CycleResult."""

from __future__ import annotations

import json
import os

import pytest
from prometheus_client import generate_latest

from testing.fake_tree import FakeTree
from throttledjob.contracts.policy import Policy
from throttledjob.contracts.progress import Progress
from throttledjob.runtime.progress_files import write_progress
from throttledjob.sidecar.agent import Agent
from throttledjob.sidecar.local import build_report
from throttledjob.sidecar.metrics import make_registry
from throttledjob.sidecar.record import CycleResult
from throttledjob.sidecar.snapshot import Health, SnapshotHolder, snapshot_of, status_document
from throttledjob.sidecar.stats import PeakTracker
from throttledjob.sidecar.summary import summarize


class Enforcer:
    """Stands in for an enforcer: the test says how long it held the workload back."""

    def __init__(self) -> None:
        self.paused_seconds = 0.0
        self.pause_capped = False

    def start(self) -> None:
        pass

    def set(self, quota, max_pause_fraction) -> None:
        pass

    def close(self) -> None:
        pass

    error = None
    busy_width = None

    def kernel_throttling(self) -> None:
        return None


def run(tmp_path, policy: Policy, usage: list[float], paused: float = 0.0,
        interval: float = 1.0) -> tuple[Agent, CycleResult]:
    now, tree, enforcer = [0.0], FakeTree(), Enforcer()
    agent = Agent(policy, tree, str(tmp_path), enforcer=enforcer, clock=lambda: now[0])
    agent.start()
    result = agent.result
    for i, cores in enumerate(usage):
        tree.cpu += cores * interval
        now[0] += interval
        enforcer.paused_seconds = paused * (i + 1) / len(usage)
        result = agent.cycle()
    return agent, result


def both_ways(result: CycleResult) -> tuple[dict, dict]:
    return build_report(result, result.wall_seconds, 0), \
        status_document(snapshot_of(result, Health()))


def test_peaks_are_over_one_second_samples_whatever_the_interval():
    tracker = PeakTracker()
    for rate in (1.0, 3.0, 2.0, 2.0):       # half-second intervals: two samples
        tracker.add(rate * 0.5, 0.5)
    tracker.add(5.0 * 0.5, 0.5)
    tracker.add(0.0, 0.5, valid=False)  # unreadable at the window's close: no sample
    summary = tracker.summary()
    assert summary.count == 2 and summary.recent == (2.0, 2.0)
    assert summary.max == 2.0 and summary.p99 == pytest.approx(2.0, abs=0.005)
    assert PeakTracker().summary().p99 is None


def test_report_and_status_agree(tmp_path):
    usage = [0.5, 1.8, 0.9, 1.0, 1.1]
    agent, result = run(tmp_path, Policy(cpu_peak_cores=1.0, enforcement="signals",
                                         rate_limit_per_second=5.0), usage, paused=1.0)
    report, status = both_ways(result)
    c = report["controller"]
    assert c["levers_used"] == status["levers"] == ["signals", "rate_limit"]
    assert c["estimated_slowdown"] == status["observed"]["slowdown"] == pytest.approx(1.25)
    assert report["cpu_peak_cores"] == status["observed"]["cpuPeakCores"]
    assert report["cpu_max_cores"] == status["observed"]["cpuMaxCores"] == 1.8
    assert report["cpu_recent_samples"] == usage and report["samples"] == len(usage)
    agent.close()


def test_slowdown_counts_at_most_99_percent_of_wall_as_held_back(tmp_path):
    # The enforcer's clock says it held the workload back longer than the run lasted.
    _, result = run(tmp_path, Policy(cpu_peak_cores=1.0, enforcement="signals"), [1.0, 1.0],
                    paused=5.0)
    report, status = both_ways(result)
    assert summarize(result).slowdown == pytest.approx(100.0)
    assert report["controller"]["estimated_slowdown"] == status["observed"]["slowdown"] == 100.0
    assert report["controller"]["paused_seconds"] == 5.0  # the measure itself, unclamped


def test_the_estimates_top_charges_time_of_unknown_cost_at_the_most_it_can_cost(tmp_path):
    """Time under one thread of two, whose cost was never measured, is left out of the
    estimate (a lower bound); the interval's top charges it at 2x, the most one thread
    of two can cost, and both outputs show the pair."""
    from throttledjob.sidecar.cpu.lever_settings import LeverSetting
    from throttledjob.sidecar.cpu.lever_time import max_lever_cost

    assert max_lever_cost(LeverSetting(threads=1), 2) == 2.0
    assert max_lever_cost(LeverSetting(threads=2, batch_scale=0.5), 8) == 8.0
    assert max_lever_cost(LeverSetting(threads=16), 8) == 1.0
    agent, result = run(tmp_path, Policy(cpu_peak_cores=1.0, enforcement="signals"),
                        [1.0] * 10)
    agent.choice.ledger.add(LeverSetting(threads=1), 4.0)   # no explorer: its cost is unknown
    result = agent.cycle()
    report, status = both_ways(result)
    known = summarize(result)
    assert known.slowdown == pytest.approx(1.0, abs=0.01)
    cores = len(os.sched_getaffinity(0))
    top = result.wall_seconds / (result.wall_seconds - 4.0 * (1 - 1 / cores))
    assert known.slowdown_high == pytest.approx(top, rel=0.01)
    assert report["controller"]["estimated_slowdown_high"] == \
        status["observed"]["slowdownHigh"] == round(known.slowdown_high, 3)
    agent.close()


def test_the_estimates_top_charges_each_setting_at_the_most_it_can_cost():
    """One thread measured at 1.6x against an R0 read under the quota, which may have
    read it low (it can be 2x), and the defaults held by that quota (up to 1.25x): the
    estimate charges what was measured, the top the most; a setting not measured at all
    is in the top only, at the most any can cost."""
    from throttledjob.sidecar.cpu.lever_settings import DEFAULT_SETTING, LeverSetting
    from throttledjob.sidecar.cpu.lever_time import LeverLedger

    one, half = LeverSetting(threads=1), LeverSetting(batch_scale=0.5)
    ledger = LeverLedger(cores=2)
    ledger.add(one, 4.0)
    ledger.add(DEFAULT_SETTING, 2.0)
    ledger.add(half, 1.0)
    costs = {one: (1.6, 2.0), DEFAULT_SETTING: (1.0, 1.25)}
    lost = ledger.time(lambda s: costs.get(s, (None,))[0],
                       lambda s: costs.get(s, (None, None))[1])
    assert lost.known == pytest.approx(4.0 * (1 - 1 / 1.6))
    assert lost.unknown == 1.0
    assert lost.bound == pytest.approx(4.0 * 0.5 + 2.0 * (1 - 1 / 1.25) + 1.0 * 0.5)
    # The top is kept when the explorer that knew it is gone (a live edit), and no
    # setting is charged past the most it can cost at all (one thread of two: 2x).
    assert ledger.time(lambda s: None, lambda s: None).bound == pytest.approx(lost.bound)
    ledger.costs.clear()
    ledger.most.clear()
    assert ledger.time(lambda s: 1.6 if s == one else None,
                       lambda s: 3.0).bound == pytest.approx(4.0 * 0.5 + 1.0 * 0.5)


def test_a_levers_cost_slows_the_time_the_workload_computes_not_its_waits():
    """One thread (1 core when busy) computed half a second, held back a tenth of the
    interval and waited the rest: half a second is what its cost slowed. Charged on the
    wait too, a bursty loop's real slowdown of 1.45 read 1.7."""
    from throttledjob.sidecar.cpu.lever_time import busy_seconds

    assert busy_seconds(1.0, 0.1, used_seconds=0.5, peak_cores=1.0) == pytest.approx(0.5)
    # Busy for all its unpaused time (2 cores when busy, 1.8 CPU-seconds): all of it.
    assert busy_seconds(1.0, 0.1, used_seconds=1.8, peak_cores=2.0) == pytest.approx(0.9)
    # The setting's cores not measured yet: its unpaused time, as before.
    assert busy_seconds(1.0, 0.1, used_seconds=0.5, peak_cores=None) == pytest.approx(0.9)


def test_an_armed_enforcer_that_never_paused_is_no_lever_used(tmp_path):
    _, result = run(tmp_path, Policy(cpu_peak_cores=1.5, enforcement="signals"), [0.5] * 3)
    assert result.last.enforcer_armed
    report, status = both_ways(result)
    assert report["controller"]["levers_used"] == status["levers"] == []


def test_threads_the_explorer_published_count_as_a_lever(tmp_path):
    # A memory-bound workload: the explorer settles on one thread (tests/sidecar/test_explorer.py).
    now, tree = [0.0], FakeTree()
    agent = Agent(Policy(cpu_peak_cores=1.0, enforcement="both"), tree, str(tmp_path),
                  clock=lambda: now[0])
    agent.start()
    steps = 0
    for _ in range(20):
        threads = agent.result.levers.threads
        tree.cpu += 1.2 if threads is None else 1.0
        steps += 100 if threads is None else 95
        write_progress(str(tmp_path), Progress(pid=os.getpid(), steps=steps))
        now[0] += 1.0
        result = agent.cycle()
    assert result.levers.threads == 1
    report, status = both_ways(result)
    assert "threads" in report["controller"]["levers_used"] and "threads" in status["levers"]
    agent.close()


@pytest.mark.parametrize(("target", "peak", "met"), [
    (0.5, 0.54, True),    # 8% over: within the kernel's own 0.05 cores
    (0.5, 0.56, False),
    (1.0, 1.04, True),
    (1.0, 1.06, False),
    (4.0, 4.19, True),    # 5% of a large target is more than the kernel's slack
    (4.0, 4.22, False),
])
def test_a_cpu_target_is_met_within_what_the_kernels_quota_itself_keeps(
        tmp_path, target: float, peak: float, met: bool) -> None:
    """A plain kernel quota reads up to 0.025 cores over 0.5 (bench/quota_spread.py): a
    CPU target is met within 5% of it or 0.05 cores, whichever is larger."""
    _, result = run(tmp_path, Policy(cpu_peak_cores=target), [peak] * 5)
    assert summarize(result).target_met is met


def test_the_pace_and_cost_of_a_step_are_read_over_ten_seconds():
    """A DDP rank doing 14 steps a second at 0.05 CPU-seconds each, its steps written in
    batches of 7 twice a second at uneven times: each second's count reads 7, 14 or 21.
    Over the window its cost reads true within 6%, where one second's swung by a third
    or more; a new phase shows within the window's length."""
    from throttledjob.sidecar.cpu.measure import PaceWindow

    window, one_second = PaceWindow(), PaceWindow(seconds=1.0)
    steps, cpu, costs, windowed = 0, 0.0, [], []
    for second in range(1, 41):
        cost = 0.05 if second <= 20 else 0.08     # a new phase at 20 s
        steps += (7, 14, 21, 14)[second % 4]      # written in batches
        cpu += 14 * cost
        costs.append(one_second.add(second, steps, cpu).cpu_seconds_per_step)
        windowed.append(window.add(second, steps, cpu))
    # (none for the first two: no span yet, then the interval of the run's first steps)
    assert max(costs[2:20]) / min(costs[2:20]) > 1.5
    assert all(abs(p.cpu_seconds_per_step / 0.05 - 1) < 0.06 for p in windowed[12:20])
    assert all(abs(p.cpu_seconds_per_step / 0.08 - 1) < 0.06 for p in windowed[32:])
    assert windowed[19].steps_per_second == pytest.approx(14.0, rel=0.06)
    # No step in the window: no cost (not 0, which would weigh the rank as free).
    idle = PaceWindow(seconds=2.0)
    for second in range(10):
        last = idle.add(second, 100, 1.0 + second)
    assert last.cpu_seconds_per_step is None and last.steps_per_second == 0.0


def test_a_ranks_start_before_its_first_step_is_not_charged_to_its_steps():
    """A DDP rank imports torch and waits at the rendezvous for 6 s at about a core, then
    steps 14 times a second at 0.05 CPU-seconds each. Two seconds into its steps its
    cost reads 0.05, not the start's CPU spread over 28 steps (0.26)."""
    from throttledjob.sidecar.cpu.measure import PaceWindow

    window, cpu, steps = PaceWindow(), 0.0, 0
    for second in range(1, 10):
        if second <= 6:
            cpu += 1.0
        else:
            steps, cpu = steps + 14, cpu + 14 * 0.05
        pace = window.add(second, steps, cpu)
        if second == 6:
            assert pace.cpu_seconds_per_step is None  # no step yet
    assert pace.cpu_seconds_per_step == pytest.approx(0.05, rel=0.01)
    # The pace is still the window's: 42 steps over its 8 s.
    assert pace.steps_per_second == pytest.approx(42 / 8)
    # Only the start: later, a window that opens on an eval phase (4 s at a core, no
    # step) is read whole, its CPU over its steps.
    for second in range(10, 30):
        if 18 <= second < 22:
            cpu += 1.0
        else:
            steps, cpu = steps + 14, cpu + 14 * 0.05
        pace = window.add(second, steps, cpu)
        if second == 25:
            # The window from 15 s: 6 stepping seconds and 4 of eval after it.
            assert pace.cpu_seconds_per_step == pytest.approx((6 * 0.7 + 4.0) / (6 * 14))


def test_a_process_leaving_the_tree_does_not_understate_the_cost_of_a_step():
    """The tree's CPU is its members' now: a DataLoader worker that exits takes 3 CPU
    seconds out of the sum. The window counts only rises, so the cost stays 0.05."""
    from throttledjob.sidecar.cpu.measure import PaceWindow

    window, cpu = PaceWindow(), 0.0
    for second in range(1, 13):
        cpu += 14 * 0.05 - (3.0 if second == 6 else 0.0)
        pace = window.add(second, 14 * second, cpu)
    assert pace.cpu_seconds_per_step == pytest.approx(0.05, rel=0.1)


@pytest.mark.parametrize(("cpu_peak", "met"), [(0.5, None), (1.5, False)])
def test_a_target_with_no_sample_is_not_called_met(tmp_path, cpu_peak: float,
                                                    met: bool | None) -> None:
    """A GPU power target where no GPU is read: unknown while the CPU target holds (the
    operator's TargetMet Unknown, the gauge absent), missed once the CPU target is."""
    policy = Policy(cpu_peak_cores=1.0, gpu_peak_power_watts=200.0)
    _, result = run(tmp_path, policy, [cpu_peak] * 5)
    assert summarize(result).target_met is met
    assert status_document(snapshot_of(result, Health()))["targetMet"] is met
    holder = SnapshotHolder()
    holder.publish(result, Health())
    exposed = generate_latest(make_registry(holder, process_metrics=False)).decode()
    assert ("throttledjob_target_met 0.0" in exposed) is (met is False)
    assert ("throttledjob_target_met " in exposed) is (met is not None)
    _, before_any_sample = run(tmp_path, Policy(cpu_peak_cores=1.0), [])
    assert summarize(before_any_sample).target_met is None


def test_the_status_keeps_the_demand_of_the_last_minute_for_a_budget(tmp_path) -> None:
    """cpuDemandHistory: each cycle's summed container demand at its time, oldest first,
    the last DEMAND_HISTORY_SECONDS; what parse_status (the operator's reader) accepts."""
    import dataclasses

    from throttledjob.contracts.status import DEMAND_HISTORY_SECONDS, parse_status

    _, result = run(tmp_path, Policy(cpu_peak_cores=1.0), [1.0])
    now = [1000.0]
    holder = SnapshotHolder(clock=lambda: now[0])
    for second in range(DEMAND_HISTORY_SECONDS + 5):
        now[0] = 1000.0 + second
        demand = {"train": 1.0 + second, "logs": 0.5} if second != 3 else {}
        holder.publish(dataclasses.replace(result, last=dataclasses.replace(
            result.last, cpu_demand_cores=demand)), Health())
    history = status_document(holder.get())["cpuDemandHistory"]
    # The last minute: seconds 4..64 (second 3 had no demand to tell).
    assert [t for t, _ in history] == [1000.0 + s for s in range(4, DEMAND_HISTORY_SECONDS + 5)]
    assert [c for _, c in history][:2] == [5.5, 6.5]
    assert parse_status(json.loads(json.dumps(status_document(holder.get()))))[
        "cpuDemandHistory"] == history


def test_the_status_keeps_the_gpus_demand_and_limit_ranges_for_a_gpu_watt_budget(tmp_path):
    """gpuDemandHistory as cpuDemandHistory, from the GPU half's demand_watts; each
    watched GPU's power limit range in telemetry.gpus (a budget's floor is its minimum)."""
    import dataclasses

    from throttledjob.contracts.status import parse_status
    from throttledjob.gpu.fake import FakeGpuBackend
    from throttledjob.sidecar.gpu_agent import GpuAgent

    agent = GpuAgent(FakeGpuBackend(2, "steady"), Policy())
    agent.cycle(1.0, 0.0, [])
    _, result = run(tmp_path, Policy(cpu_peak_cores=1.0), [1.0])
    now = [1000.0]
    holder = SnapshotHolder(clock=lambda: now[0])
    for second in range(3):
        now[0] = 1000.0 + second
        holder.publish(dataclasses.replace(result, gpu=agent.state()), Health())
    doc = parse_status(json.loads(json.dumps(status_document(holder.get()))))
    watts = round(sum(r.power_watts for r in agent.readings), 1)
    assert doc["gpuDemandHistory"] == [[1000.0, watts], [1001.0, watts], [1002.0, watts]]
    assert [(g["minLimitWatts"], g["maxLimitWatts"]) for g in doc["telemetry"]["gpus"]] == [
        (100.0, 300.0)] * 2
    assert parse_status({**doc, "gpuDemandHistory": [[1.0, -5.0]]})["gpuDemandHistory"] == []
    # One sample a second, the latest: a 0.05-s interval keeps 60 a minute, not 1,200.
    for tenth in range(1, 10):
        now[0] = 1002.0 + tenth / 10
        holder.publish(dataclasses.replace(result, gpu=agent.state()), Health())
    assert [t for t, _ in status_document(holder.get())["gpuDemandHistory"]] == [
        1000.0, 1001.0, 1002.9]
