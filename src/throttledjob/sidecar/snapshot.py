"""A consistent, immutable view of the agent after a cycle, and the /status document.

The control loop publishes a snapshot of each cycle's result; the HTTP thread only ever
reads the latest one, so a scrape never sees a half-updated agent and never blocks the
loop. The run's figures come from sidecar/summary.py, as local mode's --report's do.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from throttledjob.contracts.names import PROGRESS_PREFIX
from throttledjob.contracts.policy import Policy
from throttledjob.contracts.status import STATUS_VERSION, StatusDocument, observed_document
from throttledjob.runtime.progress import read_progress

from .agent import CycleResult, LastCycle
from .cgroups.throttling import ThrottleStats
from .enforcement import Plan
from .gpu.backend import GpuReading
from .stats import PeakSummary, round_or_none
from .summary import RunSummary, summarize


@dataclass
class Health:
    """The sidecar's own bookkeeping, written by the loop, copied into each snapshot."""

    started: float = field(default_factory=time.time)
    cycles: int = 0
    last_cycle_duration: float = 0.0
    errors_total: dict[str, int] = field(default_factory=dict)
    policy_reloads: dict[str, int] = field(default_factory=lambda: {"success": 0, "failure": 0})
    # kind -> message of each problem in force now ("policy", "progress", "gpu", ...).
    problems: dict[str, str] = field(default_factory=dict)
    cpu_telemetry: str = ""

    def problem(self, kind: str, message: str | None) -> None:
        """Set (or clear, with None) the current problem of `kind`; count new ones."""
        if message and self.problems.get(kind) != message:
            self.errors_total[kind] = self.errors_total.get(kind, 0) + 1
        if message:
            self.problems[kind] = message
        else:
            self.problems.pop(kind, None)


@dataclass(frozen=True)
class Snapshot:
    time: float
    policy: Policy
    plan: Plan
    last: LastCycle
    cpu_seconds: float
    processes: int
    cpu: PeakSummary
    gpu_telemetry: str
    gpus: tuple[GpuReading, ...]
    gpu_util: PeakSummary
    gpu_power: PeakSummary
    gpu_power_limit_lever: bool
    throttle_level: float
    slowdown: float
    slowdown_high: float
    paused_seconds: dict[str, float]
    budget_exhausted_seconds: float
    levers: tuple[str, ...]
    target_met: bool
    budget_exhausted: bool  # within the window target_met is judged over
    budget_reason: str | None  # why (decide.budget_reason)
    steps_per_second: float
    health: Health
    cpu_seconds_per_step: float | None = None
    kernel_throttling: ThrottleStats | None = None


class SnapshotHolder:
    """The latest snapshot, handed from the loop thread to the HTTP thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None

    def get(self) -> Snapshot | None:
        with self._lock:
            return self._snapshot

    def publish(self, result: CycleResult, health: Health) -> Snapshot:
        snap = snapshot_of(result, health)
        with self._lock:
            self._snapshot = snap
        return snap


def _paused_by_lever(run: RunSummary, result: CycleResult) -> dict[str, float]:
    paused = {run.enforcer_lever: run.signal_paused_seconds,
              "pacing": run.cooperative_paused_seconds}
    if result.kernel_paused_seconds:  # a pod's own limits (sidecar/cgroups/container_quota.py)
        paused["quota"] = paused.get("quota", 0.0) + result.kernel_paused_seconds
    return paused


def snapshot_of(result: CycleResult, health: Health) -> Snapshot:
    run = summarize(result)
    gpu = result.gpu
    return Snapshot(
        time=time.time(), policy=result.policy, plan=result.plan, last=result.last,
        cpu_seconds=result.cpu_seconds, processes=result.processes, cpu=run.cpu,
        gpu_telemetry=gpu.telemetry if gpu else "none",
        gpus=gpu.readings if gpu else (),
        gpu_util=run.gpu_util, gpu_power=run.gpu_power,
        gpu_power_limit_lever=bool(gpu and gpu.power_limit_lever),
        throttle_level=run.throttle_level, slowdown=run.slowdown,
        slowdown_high=run.slowdown_high,
        paused_seconds=_paused_by_lever(run, result),
        budget_exhausted_seconds=result.budget_exhausted_seconds, levers=run.levers,
        target_met=run.target_met, budget_exhausted=run.budget_exhausted,
        budget_reason=run.budget_reason,
        steps_per_second=result.last.pace.steps_per_second,
        cpu_seconds_per_step=result.last.pace.cpu_seconds_per_step,
        kernel_throttling=result.kernel_throttling,
        health=Health(health.started, health.cycles, health.last_cycle_duration,
                      dict(health.errors_total), dict(health.policy_reloads),
                      dict(health.problems), health.cpu_telemetry),
    )


def status_document(s: Snapshot) -> StatusDocument:
    """The /status JSON the operator copies into the ThrottledJob's status."""
    p = s.policy
    return {
        "version": STATUS_VERSION,
        "observed": observed_document({
            "cpuPeakCores": round_or_none(s.cpu.p99),
            "cpuMaxCores": round_or_none(s.cpu.max),
            "gpuPeakUtilizationPercent": None if s.gpu_util.p99 is None
            else round(s.gpu_util.p99 * 100.0, 1),
            "gpuMaxUtilizationPercent": None if s.gpu_util.max is None
            else round(s.gpu_util.max * 100.0, 1),
            "gpuPeakPowerWatts": round_or_none(s.gpu_power.p99, 1),
            "gpuMaxPowerWatts": round_or_none(s.gpu_power.max, 1),
            "throttleLevel": round(s.throttle_level, 3),
            "slowdown": round(s.slowdown, 3),
            "slowdownHigh": round(s.slowdown_high, 3),
            "cpuCores": round(s.last.usage_cores, 3),
            "steps": s.last.steps,
            "stepsPerSecond": round(s.steps_per_second, 3),
            "cpuSecondsPerStep": round_or_none(s.cpu_seconds_per_step, 6),
        }),
        "targetMet": s.target_met,
        "budgetExhausted": s.budget_exhausted,
        "budgetReason": s.budget_reason,
        "cpuLimitWantedCores": s.last.cpu_limit_wanted_cores,
        "cpuDemandCores": dict(s.last.cpu_demand_cores),
        "levers": list(s.levers),
        "targets": {
            "cpuPeakCores": p.cpu_peak_cores,
            "gpuPeakUtilizationPercent": p.gpu_peak_utilization_percent,
            "gpuPeakPowerWatts": p.gpu_peak_power_watts,
            "gpuMemoryFraction": p.gpu_memory_fraction,
            "maxSlowdown": p.max_slowdown,
            "mode": str(p.mode),
            "enforcement": str(s.plan.enforcement),
        },
        "errors": [f"{kind}: {message}" for kind, message in sorted(s.health.problems.items())],
        "telemetry": {"cpu": s.health.cpu_telemetry, "gpu": s.gpu_telemetry,
                      "gpus": [{"gpu": g.index, "UUID": g.uuid} for g in s.gpus],
                      "processes": s.processes},
        "cycles": s.health.cycles,
    }


def progress_problem(directory: str) -> str | None:
    """A message when some progress file in `directory` cannot be read, else None."""
    try:
        names = [n for n in os.listdir(directory)
                 if n.startswith(PROGRESS_PREFIX) and n.endswith(".json")]
    except OSError as e:
        return f"cannot list the shared directory {directory}: {e.strerror or e}"
    if not names:
        return None
    good = {f"{PROGRESS_PREFIX}{r.pid}.json" for r in read_progress(directory)}
    bad = sorted(set(names) - good)
    if bad:
        return f"ignoring {len(bad)} unreadable progress file(s), e.g. {bad[0]}"
    return None
