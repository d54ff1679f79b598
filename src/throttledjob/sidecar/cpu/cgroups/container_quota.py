"""The kernel quota of the workload's containers, seen from the sidecar (read only).

In a pod the kernel's CFS quota of each workload container (its CPU limit, which the
operator sets from the target) holds the peak; but it is in another container's cgroup,
which the sidecar's own /sys/fs/cgroup does not show. The workload's processes are
visible (shared process namespace), and so is their view of the filesystem:
/proc/PID/root/sys/fs/cgroup is the cgroup mount the runtime gave that container, with
the container's own cgroup at its root (cgroup v1: a directory per controller; v2, in a
cgroup namespace: the root itself). Reading it needs only the workload's UID, which the
sidecar runs as. Nothing is ever written there.

From it: the limit in force now (a live resize shows at once, where the sidecar's
environment keeps the first one), and the kernel's throttling counters, turned into time
held back as for a quota of our own (throttling.ThrottleAccount). A container is known by
its /proc/PID/cgroup text, one process read for each, and named by the
THROTTLEDJOB_CONTAINER variable the operator put in its environment: how much CPU each
container wanted in the last interval (its use, or its width where the kernel held it
back) goes to the operator, which splits the pod's limit by it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from throttledjob.contracts.names import ENV_CONTAINER

from ..processes import ProcessTree
from .fs import cgroup_of, read_limit
from .throttling import ThrottleAccount, ThrottleStats, read_stats, read_usage_seconds

# How long a width counts for the slowdown budget's lift: a workload that narrows gives the
# lifted limit back after this long (a lift is not dropped for one quiet interval between
# bursts, and a narrower one is not held at the widest it ever was).
WIDTH_MEMORY_SECONDS = 30.0
# Where a container's cpu controller is, under its root: v1 (Debian and most runtimes
# mount "cpu,cpuacct" with a "cpu" link to it), then v2.
CPU_DIRS = ("sys/fs/cgroup/cpu", "sys/fs/cgroup/cpu,cpuacct", "sys/fs/cgroup")


@dataclass
class _Container:
    path: str                     # its cpu controller's directory, through a process's root
    # Its time held back and width (cores its threads wanted, from its last throttled
    # periods), counted from its first reading.
    throttling: ThrottleAccount
    name: str | None = None       # as the operator named it (ENV_CONTAINER); None: unknown
    # CPU seconds used, at the last reading and when it was read (None: not readable).
    usage: float | None = None
    read_at: float = 0.0
    # Cores it wanted in the last interval: its use, or its width where it was throttled.
    demand: float | None = None
    # (when, demand) of its intervals in the last WIDTH_MEMORY_SECONDS.
    recent: list[tuple[float, float]] = field(default_factory=list)


def container_name(pid: int, proc: str = "/proc") -> str | None:
    """The container name the operator gave `pid`'s container (ENV_CONTAINER), or None."""
    try:
        with open(os.path.join(proc, str(pid), "environ"), "rb") as f:
            environ = f.read()
    except OSError:
        return None
    prefix = ENV_CONTAINER.encode() + b"="
    for item in environ.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode(errors="replace")[:63] or None
    return None


def container_cpu_dir(pid: int, proc: str = "/proc") -> str | None:
    """The cpu cgroup directory of `pid`'s container as its processes see it, or None
    (the process is gone, or its root is not ours to read)."""
    for sub in CPU_DIRS:
        path = os.path.join(proc, str(pid), "root", sub)
        if os.path.isfile(os.path.join(path, "cpu.stat")) and (
                os.path.isfile(os.path.join(path, "cpu.max"))
                or os.path.isfile(os.path.join(path, "cpu.cfs_quota_us"))):
            return path
    return None


class ContainerQuota:
    """The workload containers' kernel quota: their summed limit, the kernel's counters
    and the time they were held back. Every read fails soft (a process exits, a root is
    unreadable): what cannot be read is left out, never raised."""

    def __init__(self, tree: ProcessTree, proc: str = "/proc",
                 cgroup_text: Callable[[int], str | None] = cgroup_of,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.tree = tree
        self.proc = proc
        self._cgroup_text = cgroup_text
        self._clock = clock
        self._containers: dict[str, _Container] = {}  # by /proc/PID/cgroup text
        self._limits: dict[str, float | None] = {}  # cores
        self._first = True

    def refresh(self) -> None:
        """Find the containers of the workload's processes (new ones, moved roots), and
        account their throttling so far."""
        seen = {}
        for pid in self.tree.pids():
            key = self._cgroup_text(pid)
            if not key or key in seen:
                continue
            known = self._containers.get(key)
            if known and os.path.isdir(known.path):
                seen[key] = known
                continue
            path = container_cpu_dir(pid, self.proc)
            if path is None:
                continue
            with contextlib.suppress(OSError, ValueError):
                # Counted from its start when it started after us (the sidecar starts
                # first); one running at our first look (we restarted) from now on.
                seen[key] = known or _Container(
                    path, ThrottleAccount(read_stats(path) if self._first else ThrottleStats()),
                    name=container_name(pid, self.proc))
                seen[key].path = path
        # A container whose processes are all gone keeps its totals (the run's).
        for key, gone in self._containers.items():
            seen.setdefault(key, gone)
        self._containers = seen
        self._first = False
        self._account()

    @property
    def visible(self) -> bool:
        """At least one workload container's cgroup could be read."""
        return bool(self._limits)

    def limit_cores(self) -> float | None:
        """The summed CPU limit of the workload containers now, cores; None: one of them
        has none, or none could be read."""
        if not self._limits or any(q is None for q in self._limits.values()):
            return None
        return sum(q for q in self._limits.values() if q is not None)

    @property
    def paused_seconds(self) -> float:
        """Wall time the workload was held back: the most any of its containers was."""
        return max((c.throttling.paused_seconds for c in self._containers.values()),
                   default=0.0)

    def wanted_limit(self, target_cores: float, max_pause_fraction: float) -> float | None:
        """The summed limit that keeps the time held back within `max_pause_fraction`
        where the target would not (None: the target's limit does). A workload w cores
        wide held to Q waits 1 - Q/w of the time, so the budget f needs Q >= (1 - f) w,
        with w each container's widest demand in the last WIDTH_MEMORY_SECONDS (its width
        from the throttled periods, as CgroupQuota.set measures it for a quota of our own,
        or its use where the limit did not bind), or its last throttled width where its
        use cannot be read."""
        widths = [max(d for _, d in c.recent) if c.recent else c.throttling.width
                  for c in self._containers.values()]
        widths = [w for w in widths if w is not None]
        if not widths:
            return None
        wanted = (1.0 - max_pause_fraction) * sum(widths)
        # 2% of room: a limit the kernel holds exactly is not lifted for its own jitter.
        return round(wanted, 2) if wanted > target_cores * 1.02 else None

    @property
    def busy_width(self) -> float | None:
        """Cores the workload's containers wanted in the last interval, summed: their
        use, or their width where the kernel held them back (None: none read twice)."""
        demands = [c.demand for c in self._containers.values() if c.demand is not None]
        return sum(demands) if demands else None

    def demand_by_container(self) -> dict[str, float]:
        """Cores each named workload container wanted in the last interval: what it used,
        or where the kernel held it back, how wide it was. Containers gone or not yet read
        twice are left out."""
        return {c.name: round(c.demand, 3) for c in self._containers.values()
                if c.name and c.demand is not None}

    def kernel_throttling(self) -> ThrottleStats | None:
        """The kernel's counters (cumulative, as cpu.stat keeps them), summed over the
        containers."""
        if not self._containers:
            return None
        totals = [c.throttling.baseline for c in self._containers.values()]
        return ThrottleStats(sum(t.nr_periods for t in totals),
                             sum(t.nr_throttled for t in totals),
                             sum(t.throttled_seconds for t in totals))

    def _account(self) -> None:
        limits: dict[str, float | None] = {}
        for key, c in self._containers.items():
            try:
                now = read_stats(c.path)
                q, period = read_limit(c.path)
            except (OSError, ValueError):
                c.demand, c.recent = None, []  # gone: it wants nothing
                c.throttling.width = None
                continue
            limits[key] = None if q is None else q / period
            width = c.throttling.add(now, q, period)
            _measure_demand(c, now, width, self._clock())
        self._limits = limits


def _measure_demand(c: _Container, stats: ThrottleStats, width: float | None,
                    at: float) -> None:
    """The cores `c` wanted since its last reading (`stats`, read at `at`): its use, or
    its width where the kernel held it back in that time (its use then is only the
    limit)."""
    try:
        usage = read_usage_seconds(c.path, stats)
    except (OSError, ValueError):
        c.usage = c.demand = None
        return
    if c.usage is not None and at > c.read_at:
        used = max(0.0, usage - c.usage) / (at - c.read_at)
        c.demand = max(used, width) if width is not None else used
        c.recent = [(t, d) for t, d in c.recent if t > at - WIDTH_MEMORY_SECONDS]
        c.recent.append((at, c.demand))
    c.usage, c.read_at = usage, at
