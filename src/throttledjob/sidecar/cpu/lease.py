"""The stop lease: the promise, written before each stop, of when the workload runs again.

The signal enforcer writes it to the shared directory before it sends SIGSTOP: the pids
it is about to stop and the moment (CLOCK_MONOTONIC, one clock for every container of a
pod: they share the kernel) it will resume them. The guard (guard.py), a container of
its own, reads it: a lease whose moment has passed with its pids still stopped means the
sidecar died inside the stop, and the guard resumes them. So a dead sidecar leaves the
workload stopped no longer than it meant to stop it, plus the guard's slack.

It is written up to 50 times a second, so it is one `pwrite` into a file kept open (a
temp file and a rename cost 130 us of CPU each, a measurable share of the sidecar's
budget): a line `SEQ UNTIL PIDS SEQ`, padded with spaces over any longer line written
before. A reader that catches a write half done sees two different SEQs and takes it
for no lease (it looks again within a poll).

Stdlib only: the guard imports nothing else and stays a few MiB.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import stat
from dataclasses import dataclass

from throttledjob.contracts.names import STOP_LEASE_FILE
from throttledjob.runtime.files import read_bounded

# A lease names every process of the workload: room for tens of thousands of pids.
MAX_LEASE_BYTES = 1 << 20


@dataclass(frozen=True)
class StopLease:
    until: float  # time.monotonic() by which the writer resumes `pids`
    pids: tuple[int, ...]


def lease_path(shared_dir: str) -> str:
    return os.path.join(shared_dir, STOP_LEASE_FILE)


def encode(seq: int, lease: StopLease) -> bytes:
    pids = ",".join(str(p) for p in lease.pids) or "-"
    return f"{seq} {lease.until!r} {pids} {seq}\n".encode()


def decode(data: bytes) -> StopLease | None:
    """The lease in `data`, or None: a write caught half done, or not a lease at all
    (the directory is shared with the workload, which may write anything there)."""
    try:
        seq, until, pids, check = data.decode("ascii").split()
        lease = StopLease(float(until), () if pids == "-" else
                          tuple(int(p) for p in pids.split(",")))
    except ValueError:
        return None
    if seq != check or not math.isfinite(lease.until) or any(p <= 1 for p in lease.pids):
        return None
    return lease


class LeaseWriter:
    """Writes leases to one file, kept open. `write` raises OSError when it cannot:
    then the writer must not stop anything."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._seq = 0
        self._longest = 0

    def write(self, lease: StopLease) -> None:
        if self._fd is not None and not self._still_the_file():
            self.close()   # removed or replaced (a workload tidying the shared directory)
        if self._fd is None:
            # Non-blocking: a FIFO put at the path (the directory is the workload's too)
            # blocked the open, and the sidecar with it, holding the enforcer's lock.
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK
                         | getattr(os, "O_NOFOLLOW", 0), 0o644)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise OSError(errno.EINVAL, f"{self.path} is not a regular file")
            self._fd = fd
            # A predecessor's longer line, if any, is blanked by the first write.
            self._longest = os.fstat(self._fd).st_size
        self._seq += 1
        line = encode(self._seq, lease)
        # Blanks over what a longer line left: one write, never a truncate first.
        padded = line + b" " * max(0, self._longest - len(line))
        self._longest = max(self._longest, len(line))
        os.pwrite(self._fd, padded, 0)

    def _still_the_file(self) -> bool:
        """The open file is still the one at the path: written to a file that was
        removed, a lease reaches no guard."""
        assert self._fd is not None
        try:
            here, mine = os.stat(self.path, follow_symlinks=False), os.fstat(self._fd)
        except OSError:
            return False
        return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def read_lease(path: str) -> StopLease | None:
    """The lease in force, or None: none written, caught mid-write, or not a lease."""
    try:
        return decode(read_bounded(path, MAX_LEASE_BYTES))
    except (OSError, ValueError):
        return None
