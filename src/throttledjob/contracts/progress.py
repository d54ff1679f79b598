"""Progress files (`progress-PID.json` in the shared directory): what each cooperating
workload process tells the sidecar (steps, pid, GPUs, pauses)."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from .names import PROGRESS_PREFIX

SCHEMA_VERSION = 1
# More cooperating processes than this are not one workload's: the rest are ignored, so
# a flood of files cannot make the sidecar's loop (or its step table) grow without bound.
MAX_PROGRESS_FILES = 256


@dataclass
class Progress:
    pid: int
    steps: int = 0
    time: float = 0.0
    started: float = 0.0
    # Seconds this process spent pacing (sleeping on purpose) since it started.
    paused_seconds: float = 0.0
    # CPU seconds this process (all its threads) had used when it wrote the record: steps
    # per CPU-second between two records, whatever the sidecar's cycle and idle waits.
    cpu_seconds: float = 0.0
    # The slowdown budget stopped this process from pausing as much as the quota asked.
    pause_capped: bool = False
    batch_size: int | None = None
    oom_events: int = 0
    visible_devices: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA_VERSION, **asdict(self)}


def progress_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"{PROGRESS_PREFIX}{pid}.json")


# Linux's largest pid (pid_max at most 2^22); a larger one is no process's.
MAX_PID = 1 << 22


def _finite(value: Any, name: str) -> int | float:
    """A finite number from JSON; ValueError for anything else (1e400 decodes as inf,
    which int() would raise OverflowError on: a file anyone in the pod may write must not
    reach the sidecar's loop with an error it does not expect)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise ValueError(f"{name} is not a finite number")
    return value


def _whole(value: Any, name: str) -> int:
    return int(_finite(value, name))


def _real(value: Any, name: str) -> float:
    return float(_finite(value, name))


def parse_progress(obj: Any) -> Progress:
    """Validate a decoded progress record; raises ValueError."""
    if not isinstance(obj, dict) or obj.get("schema") != SCHEMA_VERSION:
        raise ValueError("not a progress record")
    devices = obj.get("visible_devices", [])
    if not isinstance(devices, list):
        raise ValueError("visible_devices is not a list")
    p = Progress(
        pid=_whole(obj.get("pid"), "pid"), steps=_whole(obj.get("steps", 0), "steps"),
        time=_real(obj.get("time", 0.0), "time"),
        started=_real(obj.get("started", 0.0), "started"),
        paused_seconds=_real(obj.get("paused_seconds", 0.0), "paused_seconds"),
        cpu_seconds=_real(obj.get("cpu_seconds", 0.0), "cpu_seconds"),
        pause_capped=bool(obj.get("pause_capped", False)),
        batch_size=None if obj.get("batch_size") is None
        else _whole(obj["batch_size"], "batch_size"),
        oom_events=_whole(obj.get("oom_events", 0), "oom_events"),
        visible_devices=[str(d) for d in devices][:64],
    )
    if not 0 < p.pid <= MAX_PID or p.steps < 0 or p.paused_seconds < 0 or p.cpu_seconds < 0:
        raise ValueError("progress out of range")
    return p
