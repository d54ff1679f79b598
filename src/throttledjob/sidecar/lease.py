"""The stop lease: the promise, written before each stop, of when the workload runs again.

The signal enforcer writes it to the shared directory before it sends SIGSTOP: the pids
it is about to stop and the moment (CLOCK_MONOTONIC, one clock for every container of a
pod: they share the kernel) it will resume them. The guard (guard.py), a container of
its own, reads it: a lease whose moment has passed with its pids still stopped means the
sidecar died inside the stop, and the guard resumes them. So a dead sidecar leaves the
workload stopped no longer than it meant to stop it, plus the guard's slack.

Stdlib only: the guard imports nothing else and stays a few MiB.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from throttledjob.contracts.names import STOP_LEASE_FILE
from throttledjob.runtime.files import read_json_bounded, write_json_atomic


@dataclass(frozen=True)
class StopLease:
    until: float  # time.monotonic() by which the writer resumes `pids`
    pids: tuple[int, ...]


def lease_path(shared_dir: str) -> str:
    return os.path.join(shared_dir, STOP_LEASE_FILE)


def write_lease(path: str, lease: StopLease) -> None:
    """Replace the lease atomically (a reader sees the old one or the new one); raises
    OSError when it cannot be written: then the writer must not stop anything."""
    write_json_atomic(path, {"until": lease.until, "pids": list(lease.pids)})


def read_lease(path: str) -> StopLease | None:
    """The lease in force, or None: none written, or not one (the directory is shared
    with the workload, which may write anything there)."""
    try:
        doc = read_json_bounded(path)
        until, pids = doc["until"], doc["pids"]
        if not (isinstance(until, (int, float)) and math.isfinite(until)):
            return None
        if not all(isinstance(p, int) and p > 1 for p in pids):
            return None
        return StopLease(float(until), tuple(pids))
    except (OSError, ValueError, KeyError, TypeError):
        return None
