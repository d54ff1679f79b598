"""A consistent, immutable view of the agent after a cycle, and the /status document.

The control loop publishes a snapshot of each cycle's result; the HTTP thread only ever
reads the latest one, so a scrape never sees a half-updated agent and never blocks the
loop. The run's figures come from sidecar/summary.py, as local mode's --report's do.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from throttledjob.contracts.names import PROGRESS_PREFIX
from throttledjob.contracts.status import (
    DEMAND_HISTORY_SECONDS,
    STATUS_VERSION,
    StatusDocument,
    observed_document,
)
from throttledjob.gpu.backend import GpuReading
from throttledjob.runtime.progress_files import read_progress

from .record import CycleResult
from .stats import round_or_none
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
    """The record of a cycle as readers get it: the agent's result (what it saw and did,
    agent.CycleResult), the run's figures worked out from it once (summary.RunSummary),
    and the sidecar's own health. Nothing is copied out of the result: a field added
    there is read here as `result.<field>`."""

    time: float  # wall clock (Unix seconds) at publication
    result: CycleResult
    run: RunSummary
    health: Health
    # (Unix time, the workload's summed demand in cores) of recent cycles, oldest first;
    # and of its GPUs' summed draw unheld, in watts (gpu_demand.py).
    demand_history: tuple[tuple[float, float], ...] = ()
    gpu_demand_history: tuple[tuple[float, float], ...] = ()

    @property
    def gpus(self) -> tuple[GpuReading, ...]:
        return self.result.gpu.readings if self.result.gpu else ()

    @property
    def gpu_telemetry(self) -> str:
        return self.result.gpu.telemetry if self.result.gpu else "none"


class SnapshotHolder:
    """The latest snapshot, handed from the loop thread to the HTTP thread."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._demand: deque[tuple[float, float]] = deque()
        self._gpu_demand: deque[tuple[float, float]] = deque()
        self._clock = clock

    def get(self) -> Snapshot | None:
        with self._lock:
            return self._snapshot

    def publish(self, result: CycleResult, health: Health) -> Snapshot:
        """The cycle's snapshot, with the workload's demand of the last
        DEMAND_HISTORY_SECONDS (cpuDemandHistory, gpuDemandHistory), for the readers to
        get."""
        now = self._clock()
        cpu = result.last.cpu_demand_cores
        gpu = result.gpu.demand_watts if result.gpu else None
        for kept, value, digits in ((self._demand, sum(cpu.values()) if cpu else None, 4),
                                    (self._gpu_demand, gpu, 1)):
            if value is not None:
                # One sample a second, the latest (what the operator's merge reads): a
                # short interval would keep hundreds a minute.
                if kept and math.floor(kept[-1][0]) == math.floor(now):
                    kept.pop()
                kept.append((round(now, 3), round(value, digits)))
            while kept and kept[0][0] < now - DEMAND_HISTORY_SECONDS:
                kept.popleft()
        snap = dataclasses.replace(snapshot_of(result, health),
                                   demand_history=tuple(self._demand),
                                   gpu_demand_history=tuple(self._gpu_demand))
        with self._lock:
            self._snapshot = snap
        return snap


def snapshot_of(result: CycleResult, health: Health) -> Snapshot:
    return Snapshot(time=time.time(), result=result, run=summarize(result),
                    health=Health(health.started, health.cycles, health.last_cycle_duration,
                                  dict(health.errors_total), dict(health.policy_reloads),
                                  dict(health.problems), health.cpu_telemetry))


def status_document(s: Snapshot) -> StatusDocument:
    """The /status JSON the operator copies into the ThrottledJob's status."""
    result, run = s.result, s.run
    p, last = result.policy, result.last
    return {
        "version": STATUS_VERSION,
        "observed": observed_document({
            "cpuPeakCores": round_or_none(result.cpu.p99),
            "cpuMaxCores": round_or_none(result.cpu.max),
            "gpuPeakUtilizationPercent": None if run.gpu_util.p99 is None
            else round(run.gpu_util.p99 * 100.0, 1),
            "gpuMaxUtilizationPercent": None if run.gpu_util.max is None
            else round(run.gpu_util.max * 100.0, 1),
            "gpuPeakPowerWatts": round_or_none(run.gpu_power.p99, 1),
            "gpuMaxPowerWatts": round_or_none(run.gpu_power.max, 1),
            "throttleLevel": round(run.throttle_level, 3),
            "slowdown": round(run.slowdown, 3),
            "slowdownHigh": round(run.slowdown_high, 3),
            "cpuCores": round(last.usage_cores, 3),
            "steps": last.steps,
            "stepsPerSecond": round(last.pace.steps_per_second, 3),
            "cpuSecondsPerStep": round_or_none(last.pace.cpu_seconds_per_step, 6),
        }),
        "targetMet": run.target_met,
        "budgetExhausted": result.budget_exhausted_recently,
        "budgetReason": result.budget_reason,
        "cpuLimitWantedCores": last.cpu_limit_wanted_cores,
        "cpuDemandCores": dict(last.cpu_demand_cores),
        "cpuDemandHistory": [[t, cores] for t, cores in s.demand_history],
        "gpuDemandHistory": [[t, watts] for t, watts in s.gpu_demand_history],
        "levers": list(run.levers),
        "targets": {
            "cpuPeakCores": p.cpu_peak_cores,
            "gpuPeakUtilizationPercent": p.gpu_peak_utilization_percent,
            "gpuPeakPowerWatts": p.gpu_peak_power_watts,
            "gpuMemoryFraction": p.gpu_memory_fraction,
            "maxSlowdown": p.max_slowdown,
            "mode": str(p.mode),
            "enforcement": str(result.plan.enforcement),
        },
        "errors": [f"{kind}: {message}" for kind, message in sorted(s.health.problems.items())],
        "telemetry": {"cpu": s.health.cpu_telemetry, "gpu": s.gpu_telemetry,
                      "gpus": [_gpu(g, span) for g, span in zip(
                          s.gpus, s.result.gpu.ranges if s.result.gpu else (), strict=False)],
                      "processes": result.processes},
        "cycles": s.health.cycles,
    }


def _gpu(g: GpuReading, span: tuple[float, float] | None) -> dict[str, Any]:
    """A watched GPU in /status: its index and UUID, and the range its power limit may be
    set in (a ThrottleBudget's floor is the least of it)."""
    doc: dict[str, Any] = {"gpu": g.index, "UUID": g.uuid}
    if span:
        doc["minLimitWatts"], doc["maxLimitWatts"] = span
    return doc


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
