"""The workload's processes, found and measured with psutil.

Two ways to say what the workload is: a root pid and all its descendants (local mode,
`throttledjob run`), or every process in the namespace but the sidecar's own and the
pause container's (a pod with a shared process namespace).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import threading

import psutil

from throttledjob.contracts.names import GUARD_PROCESS_NAME

from .cgroups.fs import cgroup_of, in_cgroup

_PAUSE_NAMES = ("pause", "/pause")


class ProcessTree:
    """A live set of processes whose CPU time is read as one consistent total.

    Total = sum over live members of (own + reaped children's) CPU time. When a member
    exits and a member reaps it, its time moves into the reaper's children time, so the
    total neither drops nor double counts.
    """

    def __init__(self, root_pid: int | None = None, exclude: set[int] | None = None,
                 pod_cgroup: str | None = None) -> None:
        self.root_pid = root_pid
        # Without a root pid: only processes in this pod's cgroup are the workload (with
        # hostPID the namespace is the node's, and holds the kubelet).
        self.pod_cgroup = pod_cgroup
        self.exclude = set(exclude or ()) | {os.getpid()}
        self._members: dict[int, psutil.Process] = {}
        self._lock = threading.Lock()
        self.refresh()

    def refresh(self) -> None:
        """Rescan membership (children come and go); cheap enough for a few times a second."""
        found: dict[int, psutil.Process] = {}
        try:
            if self.root_pid is not None:
                candidates = [self._process(pid) for pid in descendants(self.root_pid)]
            else:
                candidates = [p for p in psutil.process_iter() if self._is_workload(p)]
        except psutil.Error:
            candidates = []
        for p in candidates:
            if p is not None and p.pid not in self.exclude:
                found[p.pid] = p
        with self._lock:
            self._members = found

    def _process(self, pid: int) -> psutil.Process | None:
        # Keep the cached object: psutil uses it to detect pid reuse.
        cached = self._members.get(pid)
        if cached is not None:
            return cached
        try:
            return psutil.Process(pid)
        except psutil.Error:
            return None

    @property
    def scoped(self) -> bool:
        """The members are known to be the workload's own: safe to signal."""
        return self.root_pid is not None or self.pod_cgroup is not None

    def _is_workload(self, p: psutil.Process) -> bool:
        if p.pid in self.exclude:
            return False
        if self.pod_cgroup is not None and not in_cgroup(cgroup_of(p.pid), self.pod_cgroup):
            return False
        try:
            if p.ppid() in self.exclude:  # the sidecar's own helpers
                return False
            name = p.name()
            # The pod's guard (guard.py) resumes the workload: never stopped with it.
            return name != GUARD_PROCESS_NAME and not (p.pid == 1 and name in _PAUSE_NAMES)
        except psutil.Error:
            return False

    def pids(self) -> list[int]:
        with self._lock:
            return list(self._members)

    def cpu_seconds(self) -> float:
        """Cumulative CPU seconds (user + system, children included) of the workload."""
        total = 0.0
        with self._lock:
            members = list(self._members.values())
        for p in members:
            seconds = _proc_stat_cpu_seconds(p.pid) if _HAVE_PROC_STAT else None
            if seconds is None:
                try:
                    t = p.cpu_times()
                except psutil.Error:
                    continue
                seconds = t.user + t.system + t.children_user + t.children_system
            total += seconds
        return total

    def signal(self, sig: int, pids: list[int] | None = None) -> list[int]:
        """Send `sig` to members (or to `pids`); returns the pids it reached. A member
        whose pid another process has taken since the scan (it exited, the pid was
        reused) is not signalled: stopped, that process was nobody's to stop."""
        with self._lock:
            members = dict(self._members)
        reached = []
        for pid in self.pids() if pids is None else pids:
            try:
                if _send(pid, sig, members.get(pid)):
                    reached.append(pid)
            except (ProcessLookupError, PermissionError):
                continue
        return reached


def _send(pid: int, sig: int, member: psutil.Process | None) -> bool:
    """Signal `pid` if it is still `member`, the process the scan found (same pid and
    start time): checked through a pidfd, which names that one process whatever then
    becomes of the pid. Without a member or pidfds, by pid."""
    if member is None or not hasattr(os, "pidfd_open"):
        os.kill(pid, sig)
        return True
    try:
        fd = os.pidfd_open(pid)
    except OSError as e:
        if e.errno != errno.ENOSYS:   # gone (ProcessLookupError), or not ours
            raise
        os.kill(pid, sig)
        return True
    try:
        if not member.is_running():   # another process's now
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    finally:
        os.close(fd)


def descendants(root: int) -> list[int]:
    """`root` and every process below it, root first.

    Reads /proc/PID/task/TID/children (tens of microseconds for a small tree) so the
    enforcer can rescan often; falls back to psutil's full scan where the kernel lacks it.
    """
    if not _HAVE_CHILDREN_FILES:
        try:
            return [root, *(p.pid for p in psutil.Process(root).children(recursive=True))]
        except psutil.Error:
            return []
    found, queue = [], [root]
    while queue:
        pid = queue.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        found.append(pid)
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    queue.extend(int(c) for c in f.read().split())
            except OSError:
                continue
    return found


def own_cpu_seconds(pid: int) -> float | None:
    """A process's own CPU seconds, every thread, no children: what `time.process_time()`
    reads inside it. None when it is gone (or where there is no /proc)."""
    return _proc_stat_cpu_seconds(pid, children=False) if _HAVE_PROC_STAT else None


def _proc_stat_cpu_seconds(pid: int, children: bool = True) -> float | None:
    """utime + stime (+ cutime + cstime) from /proc/PID/stat, the fields psutil reads too.

    The signal enforcer reads this 50 times a second; a direct read costs a third of
    psutil's. None when the process is gone.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name may hold spaces or parentheses: split after the last ')'.
    fields = data[data.rfind(b")") + 2:].split()
    try:
        return sum(int(v) for v in fields[11:15 if children else 13]) / _CLOCK_TICKS
    except (ValueError, IndexError):
        return None


_HAVE_PROC_STAT = os.path.exists("/proc/self/stat")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_HAVE_CHILDREN_FILES = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def alive(pid: int) -> bool:
    """The process exists (one we may not signal counts: it is alive, just not ours)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def resume(pids: list[int]) -> None:
    """SIGCONT each pid that still exists; never raises."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGCONT)
