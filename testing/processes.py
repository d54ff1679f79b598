"""Processes the tests start and watch."""

from __future__ import annotations

import subprocess


def state(pid: int) -> bytes | None:
    """The process's state letter from /proc/PID/stat (None: gone). Read straight from
    /proc: tests poll it every millisecond."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name may hold spaces or parentheses: the state follows the last ')'.
    return data[data.rfind(b")") + 2:data.rfind(b")") + 3]


def stopped(pid: int) -> bool:
    """The process is in job-control stop (state T), as SIGSTOP leaves it; one traced
    (t) or gone is not."""
    return state(pid) == b"T"


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `timeout` seconds; always reaped."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
