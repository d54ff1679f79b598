"""Progress records on disk: written by each workload process, read by the sidecar."""

from __future__ import annotations

import os

from throttledjob.contracts.progress import (
    MAX_PROGRESS_FILES,
    PROGRESS_PREFIX,
    Progress,
    parse_progress,
    progress_path,
)

from .files import read_json_bounded, write_json_atomic


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
    """The well-formed progress records in `directory`, the MAX_PROGRESS_FILES written
    last (by name, the files of processes long gone could hide a live trainer's);
    malformed ones are skipped."""
    found = []
    try:
        with os.scandir(directory) as entries:
            for e in entries:
                if e.name.startswith(PROGRESS_PREFIX) and e.name.endswith(".json"):
                    try:
                        found.append((e.stat(follow_symlinks=False).st_mtime, e.path))
                    except OSError:
                        continue
    except OSError:
        return []
    records = []
    for _, path in sorted(found, reverse=True)[:MAX_PROGRESS_FILES]:
        try:
            records.append(parse_progress(read_json_bounded(path)))
        except (OSError, ValueError, TypeError, RecursionError):  # nested past the parser
            continue
    return records
