"""`throttledjob guard`: resume what a dead sidecar left stopped, when it meant to.

A container of its own in the pod (a native sidecar beside the throttle sidecar, same
UID as the workload, no capabilities, the shared directory read-only), so it does not die
with the sidecar: not when the sidecar is SIGKILLed, OOM-killed (the kernel kills the
sidecar container's cgroup, not this one) or restarted with the kubelet's crash-loop
backoff. It reads the stop lease (lease.py) the sidecar writes before every stop and,
once the lease's moment has passed by `slack` with its pids still stopped, sends them
SIGCONT. It never sends any other signal: it cannot stop anything.

The workload is stopped at most until the lease's end plus `slack` plus one `poll`
(a lease shorter than a poll is seen after it ended): 0.1 + 0.05 + 0.05 s with the
defaults, where the sidecar's stops last at most 0.1 s (enforcer.MAX_STOP_SECONDS). A
stop that lands after its lease ended (the sidecar descheduled between the two; it
undoes such a stop itself at once) is still resumed if the sidecar dies then: the guard
watches an overdue lease for LATE_SECONDS.
A healthy sidecar resumes the workload itself well before; then the guard finds nothing
stopped. Stdlib only: the whole process is a few MiB.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable

from throttledjob.contracts.names import GUARD_PROCESS_NAME

from .lease import StopLease, lease_path, read_lease

log = logging.getLogger("throttledjob.guard")

POLL_SECONDS = 0.05
SLACK_SECONDS = 0.05
# How long an overdue lease is watched: a stop the sidecar made late (descheduled between
# its lease and its SIGSTOP) lands after the lease fell due, and a sidecar killed then
# leaves it to the guard. Looked at once, the lease was passed by before the stop landed.
LATE_SECONDS = 1.0


_STOP_SIGNALS = 1 << (signal.SIGSTOP - 1)


def held(pid: int) -> bool:
    """Stopped, or about to be: a SIGSTOP sent but not yet taken stays pending until the
    process next runs, which on a busy machine can be longer than the guard's slack; it
    stops the process then, with nobody left to resume it. SIGCONT discards it."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        pending = int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)
    except (OSError, KeyError, ValueError):
        return False
    return fields["State"].split()[0] == "T" or bool(pending & _STOP_SIGNALS)


def resume_stopped(pids: Iterable[int]) -> list[int]:
    """SIGCONT each of `pids` that is stopped or has a stop pending; returns those it
    resumed. Never raises."""
    resumed = []
    for pid in pids:
        if held(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
                resumed.append(pid)
    return resumed


def overdue(lease: StopLease, now: float, slack: float = SLACK_SECONDS) -> bool:
    """The lease's moment passed `slack` ago: its writer should have resumed by now."""
    return now >= lease.until + slack


class Guard:
    """One lease at a time: wait for it to fall due, then resume what it still holds."""

    def __init__(self, path: str, poll: float = POLL_SECONDS, slack: float = SLACK_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path, self.poll, self.slack, self.clock = path, poll, slack, clock
        self.handled: StopLease | None = None
        self.rescues = 0  # leases the sidecar did not keep

    def step(self) -> float:
        """Check the lease once; returns how long to wait before the next check."""
        lease = read_lease(self.path)
        if lease is None or lease == self.handled:
            return self.poll
        now = self.clock()
        if not overdue(lease, now, self.slack):
            return min(self.poll, lease.until + self.slack - now)
        # Read again just before acting: a sidecar that was only late has written a new
        # lease for a new stop, which is not ours to cut short.
        if read_lease(self.path) == lease:
            resumed = resume_stopped(lease.pids)
            if resumed:
                self.rescues += 1
                log.warning("throttledjob guard: resumed %s, still stopped %.2f s after "
                            "the sidecar's lease ended (sidecar gone?)", resumed,
                            now - lease.until)
        if now >= lease.until + self.slack + LATE_SECONDS:
            self.handled = lease
        return self.poll

    def release(self) -> list[int]:
        """Resume whatever the current lease names, due or not (the guard is leaving)."""
        lease = read_lease(self.path)
        return resume_stopped(lease.pids) if lease else []


def name_this_process(name: str = GUARD_PROCESS_NAME) -> bool:
    """Set this process's name (/proc/PID/comm), by which the sidecar tells the guard
    from the workload in the pod's shared process namespace; False where it cannot. (In
    a pod it has that name already: its command is `tj-guard`. Not so `throttledjob
    guard`, named after its script until this runs.)"""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return False
    return prctl(_PR_SET_NAME, name.encode(), 0, 0, 0) == 0


_PR_SET_NAME = 15


def run_guard(shared_dir: str, stop: threading.Event | None = None,
              poll: float = POLL_SECONDS, slack: float = SLACK_SECONDS) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not name_this_process():
        log.warning("throttledjob guard: cannot set the process name %s: the sidecar may "
                    "count the guard as workload", GUARD_PROCESS_NAME)
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    guard = Guard(lease_path(shared_dir), poll=poll, slack=slack)
    log.info("throttledjob guard: watching %s (slack %.2f s, poll %.2f s)", guard.path,
             slack, poll)
    try:
        while not stop.wait(guard.step()):
            pass
    finally:
        guard.release()
    return 0
