"""A consistent, immutable view of the agent after a cycle, and the /status document.

The control loop takes a snapshot after each cycle; the HTTP thread only ever reads
the latest one, so a scrape never sees a half-updated agent and never blocks the loop.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field

from throttledjob.contracts.names import PROGRESS_PREFIX
from throttledjob.contracts.policy import Policy
from throttledjob.contracts.status import STATUS_VERSION, StatusDocument
from throttledjob.runtime.progress import read_progress

from .agent import Agent, CycleStatus
from .gpu import GpuReading

# A target counts as met while the p99 of recent 1-second samples is within this much
# of it: the same tolerance the benchmarks give the CPU controller.
TARGET_TOLERANCE = 0.05


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
class Peak:
    p99: float | None = None
    max: float | None = None
    recent_p99: float | None = None


@dataclass(frozen=True)
class Snapshot:
    time: float
    policy: Policy
    status: CycleStatus
    cpu_seconds: float
    processes: int
    cpu: Peak
    gpu_telemetry: str
    gpus: tuple[GpuReading, ...]
    gpu_util: Peak
    gpu_power: Peak
    gpu_power_limit_lever: bool
    throttle_level: float
    slowdown: float
    paused_seconds: dict[str, float]
    budget_exhausted_seconds: float
    levers: tuple[str, ...]
    target_met: bool
    steps_per_second: float
    health: Health


class SnapshotHolder:
    """The latest snapshot, handed from the loop thread to the HTTP thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._steps: tuple[float, int] | None = None
        self._rate = 0.0

    def get(self) -> Snapshot | None:
        with self._lock:
            return self._snapshot

    def publish(self, agent: Agent, health: Health) -> Snapshot:
        snap = take_snapshot(agent, health, self._throughput(agent))
        with self._lock:
            self._snapshot = snap
        return snap

    def _throughput(self, agent: Agent) -> float:
        now, steps = agent.clock(), agent.status.steps
        if self._steps is not None and now - self._steps[0] >= 0.5:
            self._rate = max(0.0, steps - self._steps[1]) / (now - self._steps[0])
            self._steps = (now, steps)
        elif self._steps is None:
            self._steps = (now, steps)
        return self._rate


def take_snapshot(agent: Agent, health: Health, steps_per_second: float = 0.0) -> Snapshot:
    p = agent.policy
    gpu = agent.gpu
    signal_paused = agent.enforcer.paused_seconds if agent.enforcer else 0.0
    coop_paused = agent.cooperative_paused_seconds
    wall = max(1e-9, agent.clock() - agent.started)
    paused = min(max(signal_paused, coop_paused), wall * 0.99)
    cpu = Peak(agent.cpu_stats.p99 if agent.cpu_stats.count else None,
               agent.cpu_stats.max if agent.cpu_stats.count else None,
               _p99(agent.recent_cpu))
    util = power = Peak()
    if gpu is not None and gpu.util_stats.count:
        util = Peak(gpu.util_stats.p99, gpu.util_stats.max, _p99(gpu.recent_util))
    if gpu is not None and gpu.power_stats.count:
        power = Peak(gpu.power_stats.p99, gpu.power_stats.max, _p99(gpu.recent_power))
    levers = tuple(name for name, used in (
        ("signals", signal_paused > 0 or agent.status.enforcer_armed),
        ("pacing", coop_paused > 0),
        ("threads", p.threads is not None),
        ("batch", p.batch_scale < 1),
        ("rate_limit", p.rate_limit_per_second is not None),
        ("gpu_memory_fraction", p.gpu_memory_fraction is not None),
        ("gpu_power_limit", bool(gpu and gpu.capping)),
    ) if used)
    util_target = None if p.gpu_peak_utilization_percent is None \
        else p.gpu_peak_utilization_percent / 100.0
    met = (_met(cpu.recent_p99, p.cpu_peak_cores) and _met(util.recent_p99, util_target)
           and _met(power.recent_p99, p.gpu_peak_power_watts))
    return Snapshot(
        time=time.time(), policy=p, status=agent.status, cpu_seconds=agent._last_cpu,
        processes=len(agent.tree.pids()), cpu=cpu,
        gpu_telemetry=gpu.telemetry if gpu else "none",
        gpus=tuple(gpu.readings) if gpu else (), gpu_util=util, gpu_power=power,
        gpu_power_limit_lever=bool(gpu and gpu.power_limit_lever),
        throttle_level=min(1.0, max(0.0, agent.status.pause_fraction)),
        slowdown=wall / (wall - paused),
        paused_seconds={"signals": signal_paused, "pacing": coop_paused},
        budget_exhausted_seconds=agent.budget_exhausted_seconds, levers=levers,
        target_met=met, steps_per_second=steps_per_second,
        health=Health(health.started, health.cycles, health.last_cycle_duration,
                      dict(health.errors_total), dict(health.policy_reloads),
                      dict(health.problems), health.cpu_telemetry),
    )


def status_document(s: Snapshot) -> StatusDocument:
    """The /status JSON the operator copies into the ThrottledJob's status."""
    p = s.policy
    return {
        "version": STATUS_VERSION,
        "observed": {
            "cpuPeakCores": _round(s.cpu.p99),
            "cpuMaxCores": _round(s.cpu.max),
            "gpuPeakUtilizationPercent": None if s.gpu_util.p99 is None
            else round(s.gpu_util.p99 * 100.0, 1),
            "gpuMaxUtilizationPercent": None if s.gpu_util.max is None
            else round(s.gpu_util.max * 100.0, 1),
            "gpuPeakPowerWatts": _round(s.gpu_power.p99, 1),
            "gpuMaxPowerWatts": _round(s.gpu_power.max, 1),
            "throttleLevel": round(s.throttle_level, 3),
            "slowdown": round(s.slowdown, 3),
            "cpuCores": round(s.status.usage_cores, 3),
            "steps": s.status.steps,
        },
        "targetMet": s.target_met,
        "budgetExhausted": s.status.budget_exhausted,
        "levers": list(s.levers),
        "targets": {
            "cpuPeakCores": p.cpu_peak_cores,
            "gpuPeakUtilizationPercent": p.gpu_peak_utilization_percent,
            "gpuPeakPowerWatts": p.gpu_peak_power_watts,
            "gpuMemoryFraction": p.gpu_memory_fraction,
            "maxSlowdown": p.max_slowdown,
            "mode": str(p.mode),
            "enforcement": str(p.enforcement),
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


def _p99(samples) -> float | None:
    values = sorted(samples)
    if not values:
        return None
    return values[max(0, math.ceil(0.99 * len(values)) - 1)]


def _met(observed: float | None, target: float | None) -> bool:
    return target is None or observed is None or observed <= target * (1 + TARGET_TOLERANCE)


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)
