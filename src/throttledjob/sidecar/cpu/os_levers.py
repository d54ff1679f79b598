"""Levers the kernel applies without the workload's cooperation: niceness and CPU affinity.

Pinning a workload to N CPUs caps its peak at N cores at once, whatever the program is;
a higher niceness lets neighbours win contended cores. Both need no capability on
processes of the sidecar's own UID: only *lowering* niceness needs CAP_SYS_NICE, and we
never lower it. Affinity is restored on close (fail open); niceness cannot be lowered
back without CAP_SYS_NICE, so it stays (it only matters when cores are contended).
"""

from __future__ import annotations

import os

import psutil


class OsLevers:
    def __init__(self, nice: int | None = None, cpus: int | None = None) -> None:
        self.nice = nice
        allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.all_cpus = allowed
        # The last N allowed CPUs: the first ones usually take the interrupts.
        self.pinned = allowed[-cpus:] if cpus and cpus < len(allowed) else None
        self._done: set[int] = set()
        self.errors: list[str] = []

    @property
    def active(self) -> bool:
        return bool(self.nice) or self.pinned is not None

    def apply(self, pids: list[int]) -> None:
        """Apply to processes not seen before (children inherit both from their parent)."""
        if not self.active:
            return
        for pid in pids:
            if pid in self._done:
                continue
            self._done.add(pid)
            try:
                p = psutil.Process(pid)
                if self.nice and p.nice() < self.nice:
                    p.nice(self.nice)
                if self.pinned is not None:
                    p.cpu_affinity(self.pinned)
            except psutil.NoSuchProcess:
                continue
            except (psutil.AccessDenied, OSError) as e:
                self._note(f"cannot set nice/affinity of pid {pid}: {e}")
        self._done &= set(pids)

    def restore(self) -> None:
        """Give the workload back every CPU it was allowed (fail open)."""
        if self.pinned is None:
            return
        for pid in list(self._done):
            try:
                psutil.Process(pid).cpu_affinity(self.all_cpus)
            except (psutil.Error, OSError):
                continue
        self._done.clear()

    def _note(self, error: str) -> None:
        if error not in self.errors and len(self.errors) < 20:
            self.errors.append(error)
