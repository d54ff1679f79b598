"""The long CPU-hungry workload the sidecar tests watch, and its process tree."""

from __future__ import annotations

import psutil

LONG = ("--workers", "2", "--units", "100000")


def tree(pid: int) -> list[int]:
    p = psutil.Process(pid)
    return [pid, *(c.pid for c in p.children(recursive=True))]
