"""Enforcement by the kernel: a CPU quota (CFS bandwidth control) on a cgroup of the run's own.

The same shape as `SignalEnforcer` (start(), set(), close(), paused_seconds), but the
kernel does the holding back: the command's process tree is moved into a child cgroup
`throttledjob-<owner pid>-<root pid>` whose quota is `cores x 100 ms` per 100 ms period.
Children forked later are born in it, so no scan can miss them, and nothing is ever
stopped: a throttled task is only not scheduled until the next period starts.

Whether the machine allows it is detected, never assumed (`detect()`): cgroup v2 `cpu.max`
where the cpu controller is delegated to a writable subtree, else cgroup v1
`cpu.cfs_quota_us` under the cpu controller's mount. The answer is a backend or a
one-line reason, so the run's report can say which enforcer ran and why.

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

from .processes import alive, descendants

# Shorter than the kernel's 100 ms default (what `limits.cpu` gets), not shorter still: a
# 1-second window can hold one period's quota more than its share, depending on where it
# starts (0.54 cores in one second were measured under a 0.5-core quota at 100 ms; at
# most 5% over at 50 ms), while 20 ms periods cost the workload 8-13% more CPU time for
# the same work (two busy processes held to 1.2 cores, docs/architecture.md).
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


@dataclass(frozen=True)
class Detection:
    """The usable backend, or None and why not (one line)."""

    backend: QuotaBackend | None
    reason: str

    def __bool__(self) -> bool:
        return self.backend is not None


@dataclass
class ThrottleStats:
    """The kernel's counters from cpu.stat (cumulative since the cgroup was made)."""

    nr_periods: int = 0
    nr_throttled: int = 0
    # Summed over CPUs: each CPU's run queue of the group counts its own throttled time,
    # so two busy threads held back for the same 50 ms count 100 ms.
    throttled_seconds: float = 0.0
    # CPU seconds the group used (v2's usage_usec); None on v1, whose cpu.stat has none.
    usage_seconds: float | None = None


def detect(root: str = "/", pid: int | str = "self", probe: bool = True) -> Detection:
    """Find a cgroup this process may put a CPU quota on, for a child of `pid`'s cgroup.

    `root` prefixes every path read (/proc/PID/cgroup, /proc/PID/mountinfo and the mount
    points they name), so tests can point it at a directory tree mimicking cgroupfs.
    With `probe`, a throwaway child cgroup is made and removed: only the kernel knows
    whether a mkdir or a quota write is allowed (read-only mounts, user namespaces,
    controllers bound elsewhere), and a reason taken from the real error beats a guess.
    Never raises.
    """
    try:
        with open(_at(root, f"/proc/{pid}/cgroup")) as f:
            own = _parse_proc_cgroup(f.read())
        with open(_at(root, f"/proc/{pid}/mountinfo")) as f:
            mounts = _parse_mountinfo(f.read())
    except OSError as e:
        return Detection(None, f"cannot read the process's cgroups: {_why(e)}")
    reasons = []
    # v2 first: on a hybrid machine the cpu controller is in at most one of the two, and
    # the v2 candidate says so ("no cpu controller delegated") before v1 is tried.
    for version in (2, 1):
        found = _candidate(root, version, own, mounts)
        if isinstance(found, str):
            reasons.append(found)
            continue
        if probe:
            why = _probe(found)
            if why:
                reasons.append(why)
                continue
        # Why the other version was passed over belongs in the report too.
        passed = f" ({'; '.join(reasons)})" if reasons else ""
        return Detection(found, found.describe() + passed)
    return Detection(None, "; ".join(reasons))


def _candidate(root: str, version: int, own: dict[str, str],
               mounts: list[tuple[str, str, str, set[str]]]) -> QuotaBackend | str:
    """The backend for one cgroup version, or why not (without writing anything)."""
    if version == 2:
        mount = next(((mroot, point) for mroot, point, fstype, _ in mounts
                      if fstype == "cgroup2"), None)
        path = own.get("")
        name = "cgroup v2"
        if mount is None or path is None:
            return f"{name}: not mounted" if mount is None else f"{name}: process not in it"
    else:
        mount = next(((mroot, point) for mroot, point, fstype, opts in mounts
                      if fstype == "cgroup" and "cpu" in opts), None)
        path = next((p for ctrls, p in own.items() if "cpu" in ctrls.split(",")), None)
        name = "cgroup v1 cpu controller"
        if mount is None or path is None:
            return f"{name}: not mounted" if mount is None else f"{name}: process not in it"
    home = _cgroup_dir(root, *mount, path)
    if home is None:
        return f"{name}: the process's cgroup {path} is outside the mount ({mount[0]})"
    if not os.path.isdir(home):
        return f"{name}: {home} missing"
    if version == 1:
        if not os.path.exists(os.path.join(home, "cpu.cfs_quota_us")):
            return f"{name}: no cpu.cfs_quota_us in {home} (kernel without CFS bandwidth)"
        why = _not_writable(home, "cgroup.procs")
        return f"{name} not writable: {why}" if why else QuotaBackend(1, home, home)
    # v2: a child needs `cpu` in its parent's subtree_control. The process's own cgroup
    # holds processes, so (no internal processes rule) it can only have it when it is the
    # root; otherwise the child is a sibling in the delegated parent, and moving between
    # siblings needs write access to the parent's cgroup.procs (their common ancestor).
    for parent in (home, os.path.dirname(home)):
        if not parent.startswith(_at(root, mount[1])):
            break
        if "cpu" in _read_words(os.path.join(parent, "cgroup.subtree_control")):
            why = _not_writable(parent, "cgroup.procs")
            if why:
                return f"{name}: cpu delegated at {parent} but not writable: {why}"
            return QuotaBackend(2, parent, home)
    return f"{name}: no cpu controller delegated (cpu not in cgroup.subtree_control of {home})"


def _probe(backend: QuotaBackend) -> str | None:
    """Make, configure and remove a throwaway child; the error, if any, as a reason."""
    probe = os.path.join(backend.parent, f"{PREFIX}probe-{os.getpid()}")
    try:
        os.mkdir(probe)
    except FileExistsError:
        pass
    except OSError as e:
        return f"{_label(backend)} not writable: {_why(e)}"
    try:
        _write_quota(backend.version, probe, None)
        return None
    except OSError as e:
        return f"{_label(backend)}: cannot set a quota: {_why(e)}"
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe)


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
    _paused: float = field(init=False, default=0.0)
    # The tree's width (threads wanting to run), measured from throttled periods.
    _width: float | None = field(init=False, default=None)
    _capped: bool = field(init=False, default=False)
    _last: ThrottleStats = field(init=False, default_factory=ThrottleStats)

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
                _write(os.path.join(self.path, "cpu.cfs_period_us"), str(self.period_us))
            _write_quota(self.backend.version, self.path, self._quota_us(), self.period_us)
            self._active = True
            self._move_tree()
        except OSError as e:
            self._fail(f"cannot start the cgroup quota: {_why(e)}")

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
        if wanted is not None and max_pause_fraction is not None and self._width:
            floor = (1.0 - max_pause_fraction) * self._width
            self._capped = floor > wanted
            wanted = max(wanted, floor)
        quota_cores = wanted
        if quota_cores == self.quota_cores:
            return
        self.quota_cores = quota_cores
        if not self._active:
            return
        try:
            _write_quota(self.backend.version, self.path, self._quota_us(), self.period_us)
        except OSError as e:
            self._fail(f"cannot set the cgroup quota: {_why(e)}")

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
        return self._paused

    @property
    def pause_capped(self) -> bool:
        """The slowdown budget raised the quota above what was asked."""
        return self._capped

    @property
    def stopped(self) -> bool:
        return False  # throttling is not a stop: nothing is left to resume

    def kernel_throttling(self) -> ThrottleStats | None:
        """The counters since start (kept after close(): the run's totals)."""
        if self._active:
            self._account()
        return self._last if self.path else None

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
            _write_quota(self.backend.version, self.path, None, self.period_us)
        except OSError as e:
            errors.append(f"lift quota: {_why(e)}")
        # A process forking while we move its siblings puts a child in the cgroup after
        # we read cgroup.procs: reread until it is empty (rmdir says EBUSY until then).
        for _ in range(50):
            for pid in _read_words(os.path.join(self.path, "cgroup.procs")):
                try:
                    _write(os.path.join(self.backend.home, "cgroup.procs"), pid)
                except OSError as e:
                    if e.errno != errno.ESRCH:  # gone meanwhile: nothing to move
                        errors.append(f"move {pid} back: {_why(e)}")
            try:
                os.rmdir(self.path)
                break
            except FileNotFoundError:
                break
            except OSError as e:
                if e.errno != errno.EBUSY:
                    errors.append(f"remove {self.path}: {_why(e)}")
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
                    _write(procs, str(pid))
                moved.add(pid)

    def _account(self) -> None:
        now = self.stats() if os.path.isdir(self.path) else self._last
        periods = now.nr_throttled - self._last.nr_throttled
        throttled = now.throttled_seconds - self._last.throttled_seconds
        if periods > 0 and throttled > 0 and self.quota_cores is not None:
            period = self.period_us / 1e6
            quota = (self._quota_us() or 0) / 1e6
            self._paused += held_back_seconds(periods, throttled, quota, period)
            self._width = throttled_width(periods, throttled, quota, period)
        if now.nr_periods >= self._last.nr_periods:
            self._last = now

    def _fail(self, reason: str) -> None:
        """Fail open: lift the quota, keep the reason, and leave the rest to close()."""
        self.error = reason
        self._active = False
        with contextlib.suppress(OSError):
            _write_quota(self.backend.version, self.path, None, self.period_us)


def throttled_width(periods: int, throttled_seconds: float, quota_seconds: float,
                    period_seconds: float) -> float:
    """The cores a tree wanted in `periods` throttled periods, from the kernel's throttled
    time over them.

    throttled_time is summed over CPUs, so it is not wall time: a tree of width w
    (threads able to run) held to quota Q per period P is throttled for t = w*P - Q per
    period, so w = (t + Q) / P. Exact for a saturating tree; measured, not guessed.
    """
    return (throttled_seconds / periods + quota_seconds) / period_seconds


def held_back_seconds(periods: int, throttled_seconds: float, quota_seconds: float,
                      period_seconds: float) -> float:
    """Wall time a tree was held back in `periods` throttled periods: a tree of width w
    (throttled_width) held to quota Q waits P - Q/w of each period P."""
    width = throttled_width(periods, throttled_seconds, quota_seconds, period_seconds)
    return periods * (period_seconds - quota_seconds / width)


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
        if not _read_words(os.path.join(path, "cgroup.procs")):
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


def _write_quota(version: int, path: str, quota_us: int | None,
                 period_us: int = PERIOD_US) -> None:
    if version == 2:
        _write(os.path.join(path, "cpu.max"),
               f"{'max' if quota_us is None else quota_us} {period_us}")
    else:
        _write(os.path.join(path, "cpu.cfs_quota_us"), str(-1 if quota_us is None else quota_us))


def read_stats(path: str) -> ThrottleStats:
    values = {}
    with open(os.path.join(path, "cpu.stat")) as f:
        for line in f:
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                values[key] = int(value)
    throttled = (values["throttled_usec"] / 1e6 if "throttled_usec" in values
                 else values.get("throttled_time", 0) / 1e9)
    usage = values["usage_usec"] / 1e6 if "usage_usec" in values else None
    return ThrottleStats(values.get("nr_periods", 0), values.get("nr_throttled", 0), throttled,
                         usage)


def _write(path: str, text: str) -> None:
    # One write() per value: cgroupfs parses each write on its own, and buffered writes
    # of several pids would be merged into one that the kernel refuses.
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _read_words(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.read().split()
    except OSError:
        return []


def _not_writable(directory: str, filename: str) -> str | None:
    """Why `directory` does not take a child and `filename` a write (None: it does)."""
    for path, mode in ((directory, os.W_OK | os.X_OK), (os.path.join(directory, filename),
                                                        os.W_OK)):
        if not os.access(path, mode):
            err = errno.EROFS if _read_only(path) else errno.EACCES
            return os.strerror(err)
    return None


def _read_only(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _parse_proc_cgroup(text: str) -> dict[str, str]:
    """{controllers: path} from /proc/PID/cgroup ("" is the v2 hierarchy)."""
    out = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) == 3:
            out[parts[1]] = parts[2]
    return out


def _parse_mountinfo(text: str) -> list[tuple[str, str, str, set[str]]]:
    """(root, mount point, fstype, super options) of each cgroup mount in mountinfo."""
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or not tail[0].startswith("cgroup"):
            continue
        out.append((_unescape(fields[3]), _unescape(fields[4]), tail[0],
                    set(tail[2].split(","))))
    return out


def _unescape(field_: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal (\040 ...).
    return field_.encode().decode("unicode_escape") if "\\" in field_ else field_


def _cgroup_dir(root: str, mount_root: str, mount_point: str, path: str) -> str | None:
    """The directory of cgroup `path` under a mount of the hierarchy at `mount_root`.

    Inside a container without a cgroup namespace, the mount's root is the container's
    cgroup and /proc/self/cgroup names it in full: strip the mount's root.
    """
    rel = os.path.relpath(path, mount_root) if mount_root != "/" else path.lstrip("/")
    if rel.startswith(".."):
        return None
    return os.path.normpath(os.path.join(_at(root, mount_point), "" if rel == "." else rel))


def _at(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _label(backend: QuotaBackend) -> str:
    return "cgroup v2" if backend.version == 2 else "cgroup v1 cpu controller"


def _why(e: OSError) -> str:
    return e.strerror or str(e)


__all__ = ["MIN_QUOTA_US", "PERIOD_US", "CgroupQuota", "Detection", "QuotaBackend",
           "ThrottleStats", "detect", "sweep_orphans"]
