"""The one summary of a run, read by both the /status document and local mode's --report.

Rules (each in one place, so the two outputs cannot disagree):
- peaks: p99 and max of 1-second samples over the run, and the p99 of the recent ones
  (stats.PeakTracker);
- time held back: by lever, as each lever counted it; the run's total is the larger of
  the two (they hold the same workload back at the same time, so they do not add up);
- slowdown: wall / (wall - held back - lever cost), counted at most 99% of wall (so at
  most 100, maxSlowdown's own limit), wall from the agent's start; the lever cost is
  the time the levers in force lost by themselves (one thread instead of two: slower
  steps no pause shows), from the explorer's measured unthrottled rate; slowdown_high is
  the same with a lever setting whose cost was never measured charged at the most it
  can cost (lever_time.max_lever_cost), and each measured one at the most it can cost
  where R0 was read held back (Explorer.unthrottled_rate_high): the interval;
- levers used: a duty-cycle lever (the kernel's quota or signals, pacing) once it has
  held the workload back,
  a setting while it is in force (threads and batch scale as published, the explorer's
  or the policy's; rate limit; nice; CPU affinity; GPU memory fraction; a GPU power cap
  under the board's limit); named and ordered as contracts.status.LEVERS;
- target met: the recent p99 of every target within TARGET_TOLERANCE of it; for CPU, or
  within KERNEL_SLACK_CORES, whichever is larger (cpu_peak_bound);
- budget exhausted is not worked out here: it is decide.BudgetBook's, over the same
  recent window, read from the cycle's result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from throttledjob.contracts.status import LEVERS, all_met

from .record import CycleResult
from .stats import PeakSummary

# A target counts as met while the p99 of recent 1-second samples is within this much
# of it: the same tolerance the benchmarks give the CPU controller.
TARGET_TOLERANCE = 0.05
# A CPU quota held by the kernel (CFS bandwidth), seen through 1-second samples, reads a
# little over the quota: a window is not aligned to the 100 ms periods, a period's quota
# is handed to each CPU in 5 ms slices, and the counters move at the scheduler's tick.
# Measured over a plain quota (bench/quota_spread.py, docs/dev/benchmarks.md): up to 0.014
# cores over at 1 core and 0.025 at 0.5 core. Nothing keeps a 1-second peak tighter than
# the kernel itself: the CPU target is met within this much, or TARGET_TOLERANCE of it.
KERNEL_SLACK_CORES = 0.05
# The share of wall time counted as held back at most: keeps the slowdown finite (100 at
# most, as for maxSlowdown) when the levers' clocks and the agent's disagree slightly.
MAX_PAUSED_SHARE = 0.99


@dataclass(frozen=True)
class RunSummary:
    """The run's figures worked out from a cycle's result; what the result holds as it
    is (the CPU peaks, the budget's verdict, each lever's own count) is read there."""

    gpu_util: PeakSummary   # of the busiest watched GPU (empty: no GPU)
    gpu_power: PeakSummary
    enforcer_lever: str     # "quota" (the kernel's) or "signals": who held back for it
    paused_by_lever: dict[str, float]  # time held back, by lever, as each counted it
    paused_seconds: float   # the run's total (the largest lever's: they overlap)
    slowdown: float
    slowdown_high: float   # the interval's top: lever costs at the most they can be
    throttle_level: float  # the last interval's held-back fraction, 0..1
    levers: tuple[str, ...]
    # None: no target is missed, but one has no sample yet (the first seconds, or a GPU
    # target where no GPU is read): not met, not missed either.
    target_met: bool | None


def summarize(result: CycleResult) -> RunSummary:
    p = result.policy
    gpu = result.gpu
    signal_paused = result.signal_paused_seconds
    coop_paused = result.cooperative_paused_seconds
    kernel_paused = result.kernel_paused_seconds  # a container's limit, in a pod
    paused = max(signal_paused, coop_paused, kernel_paused)
    wall = max(1e-9, result.wall_seconds)
    util = gpu.utilization if gpu else PeakSummary()
    power = gpu.power if gpu else PeakSummary()
    enforcer_lever = "quota" if result.plan.kernel_quota else "signals"
    by_lever = {enforcer_lever: signal_paused, "pacing": coop_paused}
    if kernel_paused:  # a pod's own limits (sidecar/cpu/cgroups/container_quota.py)
        by_lever["quota"] = by_lever.get("quota", 0.0) + kernel_paused
    used = {
        "quota": (enforcer_lever == "quota" and signal_paused > 0) or kernel_paused > 0,
        "signals": enforcer_lever == "signals" and signal_paused > 0,
        "pacing": coop_paused > 0,
        "threads": result.levers.threads is not None,
        "batch": result.levers.batch_scale < 1,
        "rate_limit": p.rate_limit_per_second is not None,
        "nice": p.nice is not None,
        "cpu_affinity": p.cpu_affinity is not None,
        "gpu_memory_fraction": p.gpu_memory_fraction is not None,
        "gpu_power_limit": bool(gpu and gpu.capping),
    }
    util_target = None if p.gpu_peak_utilization_percent is None \
        else p.gpu_peak_utilization_percent / 100.0
    return RunSummary(
        gpu_util=util, gpu_power=power, enforcer_lever=enforcer_lever,
        paused_by_lever=by_lever, paused_seconds=paused,
        slowdown=_slowdown(wall, paused + result.lever_cost_seconds),
        slowdown_high=_slowdown(wall, paused + result.lever_cost_bound_seconds),
        throttle_level=min(1.0, max(0.0, result.last.pause_fraction)),
        levers=tuple(name for name in LEVERS if used[name]),
        target_met=all_met((_met(result.cpu.recent_p99, p.cpu_peak_cores, cpu_peak_bound),
                            _met(util.recent_p99, util_target, _bound),
                            _met(power.recent_p99, p.gpu_peak_power_watts, _bound))),
    )


def _slowdown(wall: float, held_back: float) -> float:
    return wall / (wall - min(held_back, MAX_PAUSED_SHARE * wall))


def cpu_peak_bound(target: float) -> float:
    """The highest 1-second CPU peak (cores) that still meets a target of `target`."""
    return target + max(TARGET_TOLERANCE * target, KERNEL_SLACK_CORES)


def _bound(target: float) -> float:
    return target * (1 + TARGET_TOLERANCE)


def _met(observed: float | None, target: float | None,
         bound: Callable[[float], float]) -> bool | None:
    """True or False for a target with a sample; None for one without (no target: True)."""
    if target is None:
        return True
    return None if observed is None else observed <= bound(target)


def run_line(result: CycleResult, wall: float, exit_code: int,
             report_path: str | None = None) -> str:
    """Local mode's end-of-run summary, one line: what a user of `throttledjob run` reads
    after the command, in a terminal or a CI log alike."""
    run = summarize(result)
    p = result.policy
    parts = [f"{wall:.1f} s, exit {exit_code}"]
    if p.cpu_peak_cores is not None and result.cpu.p99 is not None:
        held = result.cpu.p99 <= cpu_peak_bound(p.cpu_peak_cores)
        parts.append(f"CPU peak {result.cpu.p99:.2f} cores p99 (max {result.cpu.max:.2f}) "
                     f"against {p.cpu_peak_cores:g}: {'held' if held else 'NOT held'}")
    elif result.cpu.p99 is not None:
        parts.append(f"CPU peak {result.cpu.p99:.2f} cores p99 (max {result.cpu.max:.2f})")
    if run.gpu_power.p99 is not None:
        parts.append(f"GPU power {run.gpu_power.p99:.0f} W p99")
    parts.append(f"slowdown {run.slowdown:.2f}x (hard target: no budget)" if p.hard else
                 f"slowdown {run.slowdown:.2f}x of {p.max_slowdown:g}x allowed"
                 + (" (the budget bound: the target gave way)"
                    if result.budget_exhausted_seconds > 0 else ""))
    parts.append("levers: " + (", ".join(run.levers) or "none needed"))
    if report_path:
        parts.append(f"report: {report_path}")
    return "throttledjob run: " + "; ".join(parts)
