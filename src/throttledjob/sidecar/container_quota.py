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
held back as for a quota of our own (quota.held_back_seconds). A container is known by
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

from .processes import ProcessTree, cgroup_of
from .quota import ThrottleStats, held_back_seconds, read_stats, throttled_width

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
    last: ThrottleStats
    name: str | None = None       # as the operator named it (ENV_CONTAINER); None: unknown
    paused: float = 0.0
    # Cores its threads wanted, from its last throttled periods (None: never throttled).
    width: float | None = None
    # CPU seconds used, at the last reading and when it was read (None: not readable).
    usage: float | None = None
    read_at: float = 0.0
    # Cores it wanted in the last interval: its use, or its width where it was throttled.
    demand: float | None = None
    # (when, demand) of its intervals in the last WIDTH_MEMORY_SECONDS.
    recent: list[tuple[float, float]] = field(default_factory=list)


def read_limit(path: str) -> tuple[float | None, float]:
    """(quota, period) of a cpu cgroup directory, seconds; quota None: unlimited."""
    try:
        with open(os.path.join(path, "cpu.max")) as f:  # v2: "max 100000", "50000 100000"
            quota, period = f.read().split()
        return (None if quota == "max" else int(quota) / 1e6), int(period) / 1e6
    except FileNotFoundError:
        pass
    with open(os.path.join(path, "cpu.cfs_quota_us")) as f:
        quota_us = int(f.read())
    with open(os.path.join(path, "cpu.cfs_period_us")) as f:
        period_us = int(f.read())
    return (None if quota_us < 0 else quota_us / 1e6), period_us / 1e6


def read_usage_seconds(path: str, stats: ThrottleStats) -> float:
    """CPU seconds a cgroup used: v2's from its cpu.stat (`stats`, read already), v1's
    cpuacct.usage (in the cpu directory where the two controllers share a mount, else
    beside it)."""
    if stats.usage_seconds is not None:
        return stats.usage_seconds
    for candidate in (path, os.path.join(os.path.dirname(path), "cpuacct")):
        with contextlib.suppress(FileNotFoundError), \
                open(os.path.join(candidate, "cpuacct.usage")) as f:
            return int(f.read()) / 1e9
    raise FileNotFoundError(f"no CPU usage counter in {path}")


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
                    path, read_stats(path) if self._first else ThrottleStats(),
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
        return max((c.paused for c in self._containers.values()), default=0.0)

    def wanted_limit(self, target_cores: float, max_pause_fraction: float) -> float | None:
        """The summed limit that keeps the time held back within `max_pause_fraction`
        where the target would not (None: the target's limit does). A workload w cores
        wide held to Q waits 1 - Q/w of the time, so the budget f needs Q >= (1 - f) w,
        with w each container's widest demand in the last WIDTH_MEMORY_SECONDS (its width
        from the throttled periods, as CgroupQuota.set measures it for a quota of our own,
        or its use where the limit did not bind), or its last throttled width where its
        use cannot be read."""
        widths = [max(d for _, d in c.recent) if c.recent else c.width
                  for c in self._containers.values()]
        widths = [w for w in widths if w is not None]
        if not widths:
            return None
        wanted = (1.0 - max_pause_fraction) * sum(widths)
        # 2% of room: a limit the kernel holds exactly is not lifted for its own jitter.
        return round(wanted, 2) if wanted > target_cores * 1.02 else None

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
        return ThrottleStats(sum(c.last.nr_periods for c in self._containers.values()),
                             sum(c.last.nr_throttled for c in self._containers.values()),
                             sum(c.last.throttled_seconds for c in self._containers.values()))

    def _account(self) -> None:
        limits: dict[str, float | None] = {}
        for key, c in self._containers.items():
            try:
                now = read_stats(c.path)
                q, period = read_limit(c.path)
            except (OSError, ValueError):
                c.demand, c.width, c.recent = None, None, []  # gone: it wants nothing
                continue
            limits[key] = None if q is None else q / period
            periods = now.nr_throttled - c.last.nr_throttled
            throttled = now.throttled_seconds - c.last.throttled_seconds
            held = None
            if periods > 0 and throttled > 0 and q:
                c.paused += held_back_seconds(periods, throttled, q, period)
                c.width = held = throttled_width(periods, throttled, q, period)
            if now.nr_periods >= c.last.nr_periods:
                c.last = now
            _measure_demand(c, now, held, self._clock())
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
