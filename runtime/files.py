"""Atomic JSON files shared between the sidecar and the workload (stdlib only)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any

# Settings and progress records are a few hundred bytes; anything far larger is not ours.
MAX_FILE_BYTES = 64 * 1024


def write_json_atomic(path: str, obj: Any) -> None:
    """Write `obj` as JSON to `path` so that readers see the old or the new file, never half.

    A temp file in the same directory is renamed over the target. No fsync: the files
    live for one run and only crash consistency against the writer matters, not power loss.
    """
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, separators=(",", ":"), allow_nan=False)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_json_bounded(path: str, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """Read and parse a JSON file of at most `max_bytes`; raises ValueError or OSError."""
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path}: larger than {max_bytes} bytes")
    return json.loads(data, parse_constant=_refuse_constant)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} is not allowed")
