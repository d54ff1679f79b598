"""Progress records: what the workload tells the sidecar (steps, pid, GPUs, pauses)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from .files import read_json_bounded, write_json_atomic

PROGRESS_PREFIX = "progress-"
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
    # The slowdown budget stopped this process from pausing as much as the quota asked.
    pause_capped: bool = False
    batch_size: int | None = None
    oom_events: int = 0
    visible_devices: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA_VERSION, **asdict(self)}


def progress_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"{PROGRESS_PREFIX}{pid}.json")


def write_progress(directory: str, progress: Progress) -> None:
    write_json_atomic(progress_path(directory, progress.pid), progress.to_dict())


def visible_devices(environ: dict[str, str] | None = None) -> list[str]:
    """GPU ids or UUIDs this process may use, as the container runtime exposes them."""
    env = os.environ if environ is None else environ
    for key in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        value = env.get(key, "").strip()
        if value and value not in ("none", "void", "NoDevFiles"):
            return [v.strip() for v in value.split(",") if v.strip()]
    return []


def count_fresh_peers(directory: str, now: float, max_age: float) -> int:
    """Progress files written within `max_age` seconds: the live cooperating processes."""
    count = 0
    try:
        with os.scandir(directory) as entries:
            for e in entries:
                if (e.name.startswith(PROGRESS_PREFIX) and e.is_file(follow_symlinks=False)
                        and now - e.stat(follow_symlinks=False).st_mtime <= max_age):
                    count += 1
    except OSError:
        return 1
    return max(1, count)


def read_progress(directory: str) -> list[Progress]:
    """All well-formed progress records in `directory`; malformed ones are skipped."""
    records = []
    try:
        names = sorted(n for n in os.listdir(directory)
                       if n.startswith(PROGRESS_PREFIX) and n.endswith(".json"))
    except OSError:
        return []
    for name in names[:MAX_PROGRESS_FILES]:
        try:
            obj = read_json_bounded(os.path.join(directory, name))
            records.append(_parse(obj))
        except (OSError, ValueError, TypeError):
            continue
    return records


def _parse(obj: Any) -> Progress:
    if not isinstance(obj, dict) or obj.get("schema") != SCHEMA_VERSION:
        raise ValueError("not a progress record")
    p = Progress(
        pid=int(obj["pid"]), steps=int(obj.get("steps", 0)), time=float(obj.get("time", 0.0)),
        started=float(obj.get("started", 0.0)),
        paused_seconds=float(obj.get("paused_seconds", 0.0)),
        pause_capped=bool(obj.get("pause_capped", False)),
        batch_size=None if obj.get("batch_size") is None else int(obj["batch_size"]),
        oom_events=int(obj.get("oom_events", 0)),
        visible_devices=[str(d) for d in obj.get("visible_devices", [])][:64],
    )
    if p.pid <= 0 or p.steps < 0 or p.paused_seconds < 0:
        raise ValueError("negative progress")
    return p
