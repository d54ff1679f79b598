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


def parse_progress(obj: Any) -> Progress:
    """Validate a decoded progress record; raises ValueError."""
    if not isinstance(obj, dict) or obj.get("schema") != SCHEMA_VERSION:
        raise ValueError("not a progress record")
    p = Progress(
        pid=int(obj["pid"]), steps=int(obj.get("steps", 0)), time=float(obj.get("time", 0.0)),
        started=float(obj.get("started", 0.0)),
        paused_seconds=float(obj.get("paused_seconds", 0.0)),
        cpu_seconds=float(obj.get("cpu_seconds", 0.0)),
        pause_capped=bool(obj.get("pause_capped", False)),
        batch_size=None if obj.get("batch_size") is None else int(obj["batch_size"]),
        oom_events=int(obj.get("oom_events", 0)),
        visible_devices=[str(d) for d in obj.get("visible_devices", [])][:64],
    )
    if p.pid <= 0 or p.steps < 0 or p.paused_seconds < 0 or not 0 <= p.cpu_seconds < math.inf:
        raise ValueError("negative progress")
    return p
