"""Enforcement by the kernel: a CPU quota (CFS bandwidth control) on a cgroup of the run's own.

The same shape as `SignalEnforcer` (start(), set(), close(), paused_seconds), but the
kernel does the holding back: the command's process tree is moved into a child cgroup
`throttledjob-<owner pid>-<root pid>` whose quota is `cores x PERIOD_US` per PERIOD_US.
Children forked later are born in it, so no scan can miss them, and nothing is ever
stopped: a throttled task is only not scheduled until the next period starts.

Where the cgroup can be made (a `QuotaBackend`) is found by `detection.detect()`.

Fail open: any error lifts the quota (the workload runs unthrottled) and is kept in
`error`; close() moves every remaining process back to where it came from and removes
the cgroup. If this process dies without close(), the next detect()-and-start on the
same machine removes the orphan (`sweep_orphans`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import time
from dataclasses import dataclass, field

from ..processes import alive, descendants
from .fs import error_text, read_words, write, write_quota
from .throttling import ThrottleAccount, ThrottleStats, read_stats

# Shorter than the kernel's 100 ms default (what `limits.cpu` gets), not shorter still: a
# 1-second window can hold one period's quota more than its share, depending on where it
# starts (0.54 cores in one second were measured under a 0.5-core quota at 100 ms; at
# most 5% over at 50 ms), while 20 ms periods cost the workload 8-13% more CPU time for
# the same work (two busy processes held to 1.2 cores, docs/dev/architecture.md).
PERIOD_US = 50_000
# The kernel refuses quotas under 1 ms (EINVAL): the lowest quota we can set.
MIN_QUOTA_US = 1_000
PREFIX = "throttledjob-"


@dataclass(frozen=True)
class QuotaBackend:
    """Where a run's child cgroup can be made, and how to talk to it."""

    version: int  # 1: cpu.cfs_quota_us + cpu.cfs_period_us, 2: cpu.max
    parent: str  # the directory the child cgroup is made in
    home: str  # the directory the workload's processes are in now (and go back to)

    def describe(self) -> str:
        if self.version == 2:
            return f"cgroup v2 cpu.max under {self.parent}"
        return f"cgroup v1 cpu.cfs_quota_us under {self.parent}"


@dataclass
class CgroupQuota:
    """Holds a process tree to a CPU quota with the kernel's CFS bandwidth control.

    start() makes the cgroup and moves the tree in (a quota set before start() applies
    from the move on); set(cores) changes the quota at once (None: unlimited); close()
    lifts it, moves everyone back and removes the cgroup. Errors never propagate from
    start(), set() or close(): they lift the quota and are kept in `error`.
    """

    root_pid: int
    backend: QuotaBackend
    name: str = ""
    period_us: int = PERIOD_US
    error: str | None = None
    quota_cores: float | None = None
    path: str = field(init=False, default="")
    _active: bool = field(init=False, default=False)
    _closed: bool = field(init=False, default=False)
    _capped: bool = field(init=False, default=False)
    # Time held back, and the tree's width (threads wanting to run) from its throttled
    # periods, since start.
    _throttling: ThrottleAccount = field(init=False, default_factory=ThrottleAccount)

    def __post_init__(self) -> None:
        self.name = self.name or f"{PREFIX}{os.getpid()}-{self.root_pid}"
        self.path = os.path.join(self.backend.parent, self.name)

    @property
    def active(self) -> bool:
        """The tree is in the cgroup and the quota (if any) is in force."""
        return self._active

    def start(self) -> None:
        if self._active or self._closed:
            return
        sweep_orphans(self.backend)
        try:
            os.mkdir(self.path)
            if self.backend.version == 1:
                write(os.path.join(self.path, "cpu.cfs_period_us"), str(self.period_us))
            write_quota(self.backend.version, self.path, self._quota_us(), self.period_us)
            self._active = True
            self._move_tree()
        except OSError as e:
            self._fail(f"cannot start the cgroup quota: {error_text(e)}")

    def set(self, quota_cores: float | None, max_pause_fraction: float | None = None) -> None:
        """Set the quota in cores (None: unlimited), never holding the tree back more than
        `max_pause_fraction` of wall time (the slowdown budget).

        A tree of width w held to Q cores waits 1 - Q/w of the time, so the budget f keeps
        the quota at (1 - f) * w at least; w is measured from the throttled periods (unknown
        until the quota first binds, when the budget cannot yet be passed).
        """
        self._account()  # the pauses so far at the old quota
        wanted = quota_cores
        self._capped = False
        if wanted is not None and max_pause_fraction is not None and self._throttling.width:
            floor = (1.0 - max_pause_fraction) * self._throttling.width
            self._capped = floor > wanted
            wanted = max(wanted, floor)
        quota_cores = wanted
        if quota_cores == self.quota_cores:
            return
        self.quota_cores = quota_cores
        if not self._active:
            return
        try:
            write_quota(self.backend.version, self.path, self._quota_us(), self.period_us)
        except OSError as e:
            self._fail(f"cannot set the cgroup quota: {error_text(e)}")

    def stats(self) -> ThrottleStats:
        """The kernel's throttling counters (zeros when the cgroup is gone)."""
        try:
            return read_stats(self.path)
        except OSError:
            return ThrottleStats()

    @property
    def paused_seconds(self) -> float:
        """Wall seconds the tree was held back, from the kernel's counters
        (held_back_seconds)."""
        self._account()
        return self._throttling.paused_seconds

    @property
    def pause_capped(self) -> bool:
        """The slowdown budget raised the quota above what was asked."""
        return self._capped

    @property
    def busy_width(self) -> float | None:
        """Cores the tree wanted in its last throttled periods (throttled_width): its
        demand at its busy moments, which an interval's average understates when part of
        the interval was idle. As of the last accounting (`paused_seconds`, `set`):
        read with the interval's pause, it is the same periods' width."""
        return self._throttling.width

    @property
    def stopped(self) -> bool:
        return False  # throttling is not a stop: nothing is left to resume

    def kernel_throttling(self) -> ThrottleStats | None:
        """The counters since start (kept after close(): the run's totals)."""
        if self._active:
            self._account()
        return self._throttling.baseline if self.path else None

    def close(self) -> None:
        """Lift the quota, move every process back and remove the cgroup. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._account()
        self._active = False
        if not os.path.isdir(self.path):
            return
        errors = []
        try:
            write_quota(self.backend.version, self.path, None, self.period_us)
        except OSError as e:
            errors.append(f"lift quota: {error_text(e)}")
        # A process forking while we move its siblings puts a child in the cgroup after
        # we read cgroup.procs: reread until it is empty (rmdir says EBUSY until then).
        for _ in range(50):
            for pid in read_words(os.path.join(self.path, "cgroup.procs")):
                try:
                    write(os.path.join(self.backend.home, "cgroup.procs"), pid)
                except OSError as e:
                    if e.errno != errno.ESRCH:  # gone meanwhile: nothing to move
                        errors.append(f"move {pid} back: {error_text(e)}")
            try:
                os.rmdir(self.path)
                break
            except FileNotFoundError:
                break
            except OSError as e:
                if e.errno != errno.EBUSY:
                    errors.append(f"remove {self.path}: {error_text(e)}")
                    break
                time.sleep(0.01)
        else:
            errors.append(f"remove {self.path}: still busy")
        if errors:
            self.error = "; ".join(dict.fromkeys(errors))

    def release_script(self) -> str:
        """A /bin/sh script doing close()'s work, for a guardian that outlives us.

        If this process is SIGKILLed, nothing in it runs: local mode's guardian shell
        (sidecar/local.py) can run this after its pipe closes, so the workload does not
        stay throttled (and the cgroup does not stay behind) until the next run's sweep.
        """
        lift = ("echo max {period} > {q}/cpu.max" if self.backend.version == 2
                else "echo -1 > {q}/cpu.cfs_quota_us")
        q, home = shlex.quote(self.path), shlex.quote(self.backend.home)
        return (f"[ -d {q} ] || exit 0; " + lift.format(period=self.period_us, q=q)
                + " 2>/dev/null; for _ in 1 2 3 4 5 6 7 8 9 10; do "
                f"for p in $(cat {q}/cgroup.procs 2>/dev/null); do "
                f"echo $p > {home}/cgroup.procs 2>/dev/null; done; "
                f"rmdir {q} 2>/dev/null && exit 0; sleep 0.05; done; exit 1")

    def __enter__(self) -> CgroupQuota:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _quota_us(self) -> int | None:
        if self.quota_cores is None:
            return None
        return max(MIN_QUOTA_US, round(self.quota_cores * self.period_us))

    def _move_tree(self) -> None:
        """Move the root and its descendants in; repeat while the tree grows.

        A child forked after its parent moved is born inside; one forked before, by a
        parent not yet moved, is found by the next scan.
        """
        procs = os.path.join(self.path, "cgroup.procs")
        moved: set[int] = set()
        for _ in range(10):
            pending = [pid for pid in descendants(self.root_pid) if pid not in moved]
            if not pending:
                return
            for pid in pending:
                with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                    write(procs, str(pid))
                moved.add(pid)

    def _account(self) -> None:
        if not os.path.isdir(self.path):
            return  # gone (closed): what was counted stays
        quota_us = self._quota_us()
        self._throttling.add(self.stats(), None if quota_us is None else quota_us / 1e6,
                             self.period_us / 1e6)

    def _fail(self, reason: str) -> None:
        """Fail open: lift the quota, keep the reason, and leave the rest to close()."""
        self.error = reason
        self._active = False
        with contextlib.suppress(OSError):
            write_quota(self.backend.version, self.path, None, self.period_us)


def sweep_orphans(backend: QuotaBackend) -> list[str]:
    """Remove the cgroups of runs whose owner died without close(); returns their paths.

    Their quota is lifted and their processes go back to the parent: a workload is never
    left throttled by a sidecar that is gone.
    """
    removed = []
    try:
        names = os.listdir(backend.parent)
    except OSError:
        return removed
    for name in names:
        owner = _owner(name)
        if owner is None or alive(owner):
            continue
        path = os.path.join(backend.parent, name)
        if not read_words(os.path.join(path, "cgroup.procs")):
            # Empty to us: remove it, but if it is busy its processes are in another pid
            # namespace (so may its owner be): someone else's run, left alone.
            with contextlib.suppress(OSError):
                os.rmdir(path)
                removed.append(path)
            continue
        q = CgroupQuota(0, backend, name=name)
        q.close()
        if not os.path.isdir(q.path):
            removed.append(q.path)
    return removed


def _owner(name: str) -> int | None:
    parts = name[len(PREFIX):].split("-") if name.startswith(PREFIX) else []
    return int(parts[0]) if len(parts) == 2 and all(p.isdigit() for p in parts) else None

