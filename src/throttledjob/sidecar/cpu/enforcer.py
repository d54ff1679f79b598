"""Enforcement without cooperation: what the agent needs of an enforcer, and the
SIGSTOP/SIGCONT one.

`Enforcer` is the whole interface the agent uses, so another way of holding the tree
to a rate (a kernel CPU quota) fits beside `SignalEnforcer` without touching the agent.

`SignalEnforcer` runs the same token bucket as the runtime's pacing
(throttledjob.runtime.budget), evaluated every `tick` seconds on the tree's CPU time, as
cpulimit does. Every process it stops is resumed when it stops itself, whatever the exit
path; in a pod, each stop is announced first by a stop lease (lease.py) so that the guard
resumes it on time even if this process dies inside it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Protocol

from throttledjob.runtime.budget import CpuBudget

from .cgroups.throttling import ThrottleStats
from .guard import held
from .lease import LeaseWriter, StopLease
from .processes import ProcessTree, resume


class Enforcer(Protocol):
    """Holds the workload to a CPU rate without its cooperation."""

    def start(self) -> None:
        """Begin enforcing (unarmed until `set` gives a rate)."""

    def set(self, rate_cores: float | None, max_pause_fraction: float | None) -> None:
        """The rate from now on (None: disarmed), never pausing more than
        `max_pause_fraction` of wall time (the slowdown budget; None: a probe, held at
        the rate off the budget's books)."""

    def close(self) -> None:
        """Stop enforcing and leave nothing held back. Safe to call twice."""

    @property
    def paused_seconds(self) -> float:
        """Time the workload was held back so far."""

    @property
    def pause_capped(self) -> bool:
        """The slowdown budget refused a pause that the rate wanted."""

    def kernel_throttling(self) -> ThrottleStats | None:
        """The kernel's CFS throttling counters, where the kernel does the holding."""

    @property
    def busy_width(self) -> float | None:
        """Cores the tree wanted at its busy moments, from its last throttled periods,
        where the kernel does the holding (None: not known)."""

    @property
    def error(self) -> str | None:
        """Why it fails open now (holds nothing back), or None."""

    def release_script(self) -> str:
        """Shell commands that undo what it holds, for local mode's guardian to run if
        this process dies (a kernel quota: lift it, remove its cgroup); "" where the
        guardian's SIGCONT to the command's process group is enough."""


class SignalEnforcer:
    """A daemon thread that holds a process tree to a CPU rate by stopping it."""

    def __init__(self, tree: ProcessTree, tick: float = 0.02, burst_seconds: float = 0.05,
                 refresh_every: float = 0.1, process_group: int | None = None,
                 lease_path: str | None = None) -> None:
        self.tree = tree
        # Where each stop is announced before it is made (a pod's guard reads it); a stop
        # that cannot be announced is not made.
        self.lease = LeaseWriter(lease_path) if lease_path else None
        # Why it holds nothing back now (a stop it could not announce), or None.
        self.error: str | None = None
        # Also stop the whole group (local mode: the command's session): a child forked
        # since the last scan is stopped with its parent instead of running free.
        self.process_group = process_group
        self.tick = tick
        self.refresh_every = refresh_every
        self.budget = CpuBudget(burst_seconds=burst_seconds)
        self._stopped: list[int] = []
        self._quit = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="throttledjob-enforcer",
                                        daemon=True)

    def set(self, rate_cores: float | None, max_pause_fraction: float | None) -> None:
        with self._lock:
            self.budget.set(rate_cores, max_pause_fraction)

    @property
    def paused_seconds(self) -> float:
        return self.budget.paused_seconds

    @property
    def pause_capped(self) -> bool:
        return self.budget.pause_capped

    def kernel_throttling(self) -> ThrottleStats | None:
        return None  # signals hold the tree; the kernel throttles nothing

    @property
    def busy_width(self) -> float | None:
        return None  # a stopped tree's width is not measured

    def release_script(self) -> str:
        return ""  # a stopped process needs only the guardian's SIGCONT

    @property
    def stopped(self) -> bool:
        return bool(self._stopped)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop the thread and resume everything it stopped. Safe to call twice."""
        self._quit.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        self._resume()
        if self.lease:
            self.lease.close()

    def _run(self) -> None:
        next_refresh = time.monotonic() + self.refresh_every
        try:
            while not self._quit.is_set():
                now = time.monotonic()
                if now >= next_refresh:
                    self.tree.refresh()
                    next_refresh = now + self.refresh_every
                with self._lock:
                    armed = bool(self.budget.rate_cores)
                    if not armed:
                        # Disarmed: read nothing, and start afresh when armed again.
                        self.budget.forget_baseline()
                if not armed:
                    self._quit.wait(self.refresh_every)
                    continue
                with self._lock:
                    # Decided and made under the lock: once set(None) returns (the pod's
                    # preStop), no new stop begins.
                    pause = self.budget.pause_for(self.tree.cpu_seconds(), now) \
                        if self.budget.rate_cores else 0.0
                    pause = min(pause, self.max_stop_seconds)
                    stopping = pause > 0.0 and self._stop(pause)
                if stopping:
                    self._quit.wait(pause)
                    self._resume()
                    self.budget.record_pause(time.monotonic() - now)
                else:
                    self._quit.wait(self.tick)
        finally:
            self._resume()

    @property
    def max_stop_seconds(self) -> float:
        """The longest single stop: what a dead enforcer's stop can last (the guard's
        bound is this plus its slack and poll)."""
        return self.tick * 5

    def _stop(self, pause: float) -> bool:
        """Announce a stop of `pause` seconds and make it; False: not made."""
        # Not a process the workload keeps stopped itself (job control, a supervisor's
        # pause): stopped with the rest, our resume would have let it run.
        pids = [p for p in self.tree.pids() if not held(p)]
        lease = StopLease(time.monotonic() + pause, tuple(pids))
        if not self._announce(lease):
            return False
        self._stopped = self.tree.signal(signal.SIGSTOP, pids)
        self._signal_group(signal.SIGSTOP)
        if time.monotonic() >= lease.until:
            # Made after its lease ended (this thread descheduled between the two): the
            # guard may have passed that lease by already, so nobody else would resume it.
            self._resume()
            return False
        return True

    def _announce(self, lease: StopLease) -> bool:
        """Write the lease for the stop about to be made; False: it could not be, and
        the stop must not be made (fail open)."""
        if self.lease is None:
            return True
        try:
            self.lease.write(lease)
        except OSError as e:
            self.error = (f"cannot write the stop lease ({e.strerror or e}): nothing is "
                          "stopped that the guard could not resume")
            return False
        self.error = None
        return True

    def _resume(self) -> None:
        stopped, self._stopped = self._stopped, []
        self._signal_group(signal.SIGCONT)
        resume(stopped)

    def _signal_group(self, sig: int) -> None:
        if self.process_group is not None:
            with contextlib.suppress(OSError):
                os.killpg(self.process_group, sig)
