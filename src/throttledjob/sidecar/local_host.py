"""The control loop's host in local mode: the command's exit ends the loop, and each
cycle shows a status line on a terminal."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from typing import TextIO

from .record import CycleResult


class LocalHost:
    """The command around the loop: it ends when the command exits; each cycle shows a
    status line on a terminal."""

    def __init__(self, proc: subprocess.Popen, status_stream: TextIO | None) -> None:
        self._wait = _exit_waiter(proc)
        self._stream = status_stream if status_stream is not None and is_tty(
            status_stream) else None
        self.exit_code = 0
        self.killed_by: int | None = None   # the signal that killed the command

    def wait(self, timeout: float) -> bool:
        code = self._wait(timeout)
        if code is None:
            return False
        self.exit_code = 128 - code if code < 0 else code
        self.killed_by = -code if code < 0 else None
        return True

    def before_cycle(self) -> None:
        pass

    def after_cycle(self, result: CycleResult) -> None:
        if self._stream is not None:
            self._stream.write("\r" + status_line(result) + "\033[K")
            self._stream.flush()

    def cycle_failed(self, error: Exception, in_a_row: int) -> None:
        if in_a_row == 1:
            sys.stderr.write(f"throttledjob: control cycle failed, workload released: "
                             f"{error!r}\n")


def _exit_waiter(proc: subprocess.Popen):
    """A function waiting up to `timeout` seconds for `proc` to exit (its code, or None).

    Popen.wait(timeout) polls with growing sleeps, dozens of wake-ups a second; a pidfd
    lets the kernel wake us exactly when the command exits.
    """
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        pidfd = None

    def wait(timeout: float) -> int | None:
        if pidfd is None:
            try:
                return proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return None
        ready, _, _ = select.select([pidfd], [], [], timeout)
        if not ready:
            return None
        os.close(pidfd)
        return proc.wait()

    return wait


def status_line(result: CycleResult) -> str:
    last, policy = result.last, result.policy
    target = f"{policy.cpu_peak_cores:.2f}" if policy.cpu_peak_cores else "-"
    state = "over budget" if result.budget_exhausted_recently else (
        "throttling" if last.throttling else "under target")
    return (f"throttledjob: cpu {last.usage_cores:.2f} cores (target {target}, "
            f"p99 {result.cpu.p99 or 0.0:.2f}) | paused {last.pause_fraction:.0%} | {state}")


def is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
