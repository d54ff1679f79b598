"""Atomic JSON files shared between the sidecar and the workload (stdlib only)."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from typing import Any

# Settings and progress records are a few hundred bytes; anything far larger is not ours.
MAX_FILE_BYTES = 64 * 1024


def write_json_atomic(path: str, obj: Any, indent: int | None = None,
                      mode: int | None = None) -> None:
    """Write `obj` as JSON to `path` so that readers see the old or the new file, never half.

    A temp file in the same directory is renamed over the target; `mode`: its permission
    bits (else mkstemp's 0600). No fsync: the files live for one run and only crash
    consistency against the writer matters, not power loss.
    """
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, separators=None if indent else (",", ":"), indent=indent,
                      allow_nan=False)
            f.write("\n" if indent else "")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# The directory is shared with the workload, which may put anything there: a FIFO (whose
# open() blocked the sidecar's loop forever, and local mode past SIGTERM) or a symlink to
# a file that is not ours. Never follow, never block, regular files only.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) \
    | getattr(os, "O_CLOEXEC", 0)


def read_bounded(path: str, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """Read a regular file of at most `max_bytes`, without following a symlink or
    blocking on a FIFO; raises ValueError or OSError."""
    fd = os.open(path, _OPEN_FLAGS)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path}: not a regular file")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path}: larger than {max_bytes} bytes")
    return data


def read_json_bounded(path: str, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """Read and parse a regular JSON file of at most `max_bytes` (as read_bounded);
    raises ValueError or OSError."""
    return json.loads(read_bounded(path, max_bytes), parse_constant=_refuse_constant)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} is not allowed")
