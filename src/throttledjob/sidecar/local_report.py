"""The --report of `throttledjob run`: its JSON built from the run's result, and written
whole or not at all (checked writable before the command starts)."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import tempfile
from typing import Any

from throttledjob.runtime.files import write_json_atomic

from .cpu.cgroups.throttling import ThrottleStats
from .record import CycleResult
from .stats import round_or_none
from .summary import summarize


def build_report(result: CycleResult, wall: float, exit_code: int,
                 explorer: dict | None = None, gpu: dict | None = None) -> dict:
    """The --report JSON. The run's figures (peaks, time held back, slowdown, levers)
    come from sidecar/summary.py, as /status's do; `wall` is the command's own."""
    run = summarize(result)
    policy = result.policy
    total_cpu = _children_cpu_seconds()
    return {
        "exit_code": exit_code,
        "wall_seconds": round(wall, 3),
        "cpu_target_cores": policy.cpu_peak_cores,
        "cpu_peak_cores": round(result.cpu.p99 or 0.0, 3),
        "cpu_max_cores": round(result.cpu.max or 0.0, 3),
        "cpu_mean_cores": round(total_cpu / wall, 3) if wall > 0 else 0.0,
        "cpu_seconds": round(total_cpu, 3),
        "samples": result.cpu.count,
        # The last minute of 1-second samples, oldest first.
        "cpu_recent_samples": [round(c, 3) for c in result.cpu.recent],
        # Units of work reported through the runtime library (step() or the auto-hook).
        "steps": result.last.steps,
        "max_slowdown": policy.max_slowdown,
        "hold": policy.hold,
        "enforcement": result.plan.enforcement,
        "mode": policy.mode,
        "controller": {
            "levers_used": list(run.levers),
            "paused_seconds": round(run.paused_seconds, 3),
            "signal_paused_seconds": round(result.signal_paused_seconds, 3),
            "cooperative_paused_seconds": round(result.cooperative_paused_seconds, 3),
            # What the levers in force cost by themselves (slower steps, no pause).
            "lever_cost_seconds": round(result.lever_cost_seconds, 3),
            "estimated_slowdown": round(run.slowdown, 3),
            # Time run under lever settings whose own cost was never measured (the run
            # ended before the defaults were): over 0, the estimate is a lower bound.
            "lever_cost_unknown_seconds": round(result.lever_cost_unknown_seconds, 3),
            # The estimate's top: that time charged at the most its setting can cost, and
            # every setting at the most it can where the unthrottled rate was read held
            # back (Explorer.unthrottled_rate_high).
            "estimated_slowdown_high": round(run.slowdown_high, 3),
            # Wall time the explorer's probes held the target off the budget's books,
            # and the most CPU (cores) an interval of them used.
            "probe_seconds": round(result.probe_seconds, 3),
            "probe_max_cores": round_or_none(result.probe_max_cores),
            "budget_exhausted_seconds": round(result.budget_exhausted_seconds, 3),
            # Why, where the budget stood in a target's way at the end (cpu/decide.py).
            "budget_exhausted_reason": result.budget_reason,
            # The controller's last rate (the key's "quota" predates the word "rate").
            "final_quota_cores": round_or_none(result.controller_rate),
            # Which enforcer held the workload, and why that one (sidecar/cpu/enforcement.py).
            "enforcer": result.plan.reason,
            # The kernel quota's own counters (cpu.stat), where it held the workload.
            "kernel_throttling": _kernel_counters(result.kernel_throttling),
            # What the lever explorer measured and chose (None when it did not run).
            "explorer": explorer,
            # This tool's own CPU (start-up, sampling, control, signals), not the command's.
            "own_cpu_seconds": round(own_cpu_seconds(), 3),
        },
        **({"gpu": gpu} if gpu is not None else {}),
    }


def _kernel_counters(k: ThrottleStats | None) -> dict | None:
    if k is None:
        return None
    return {"periods": k.nr_periods, "throttled_periods": k.nr_throttled,
            "throttled_seconds": round(k.throttled_seconds, 3)}


def _children_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def own_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime



def write_report(path: str, report: dict[str, Any]) -> None:
    """The report, whole or not at all: a regular file (or none yet) is replaced by
    rename, through a symlink to where it points, keeping an existing file's mode; a
    device or a pipe (/dev/stdout) is written as it is."""
    if _written_as_is(path):
        with open(path, "w") as f:
            f.write(json.dumps(report, indent=2, allow_nan=False) + "\n")
        return
    real = os.path.realpath(path)
    mode = os.stat(real).st_mode & 0o777 if os.path.exists(real) else 0o666 & ~_umask()
    write_json_atomic(real, report, indent=2, mode=mode)


def _written_as_is(path: str) -> bool:
    """A device or a pipe (/dev/stdout), through any link: written as it is, never
    replaced by rename."""
    return os.path.exists(path) and not os.path.isfile(path)


def _umask() -> int:
    """The process's umask, read without setting it (os.umask sets it, for every thread)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def report_problem(path: str) -> str | None:
    """Why a report could not be written at `path` (checked before the command starts,
    not found after a run of hours), or None."""
    if not path:
        return "an empty path"
    if os.path.isdir(path):
        return f"{path} is a directory"
    if _written_as_is(path):
        return None
    directory = os.path.dirname(os.path.realpath(path))
    try:
        fd, probe = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    except OSError as e:
        return f"cannot write in {directory}: {e.strerror}"
    os.close(fd)
    os.unlink(probe)
    return None


def save_report(path: str, report: dict[str, Any]) -> None:
    """Write the report, saying on stderr why where it cannot be written: the command's
    exit code stands whatever befalls the report."""
    try:
        write_report(path, report)
    except (OSError, ValueError) as e:
        sys.stderr.write(f"throttledjob run: error: --report: cannot write "
                         f"{path}: {getattr(e, 'strerror', None) or e}\n")
