"""The control loop: one for both hosts (the pod's sidecar, local mode's `run`).

A host says when to stop and what to do around each cycle; the loop keeps the rhythm and
the one fail-open rule: a cycle that raises releases the workload (every process
resumed, the enforcer disarmed) and the next interval tries again, so a bug never holds
the workload back and a passing fault (a process gone mid-read) does not end throttling.
"""

from __future__ import annotations

import time
from typing import Protocol

from .agent import Agent
from .record import CycleResult


class Host(Protocol):
    def wait(self, timeout: float) -> bool:
        """Sleep up to `timeout` seconds; True when the loop is to end."""

    def before_cycle(self) -> None:
        """Bring the agent up to date (a policy edited live, a limit resized)."""

    def after_cycle(self, result: CycleResult) -> None:
        """Show the cycle's result (a status line, a problem to report)."""

    def cycle_failed(self, error: Exception, in_a_row: int) -> None:
        """Say that a cycle failed (`in_a_row`: 1 for the first of a run of failures)."""


def run_loop(agent: Agent, host: Host) -> None:
    """Cycle `agent` every `policy.interval_seconds` (read each time: a live edit may
    change it) until the host says to stop."""
    next_cycle = time.monotonic()
    failures = 0
    while True:
        next_cycle += agent.policy.interval_seconds
        if host.wait(max(0.0, next_cycle - time.monotonic())):
            return
        host.before_cycle()
        try:
            result = agent.cycle()
        except Exception as e:  # fail open: a bug must not leave the workload held back
            failures += 1
            agent.release()
            host.cycle_failed(e, failures)
            continue
        failures = 0
        host.after_cycle(result)
