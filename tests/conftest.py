"""Shared test helpers. Tests run against the installed package (`make install`)."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
# Two busy processes (or one, with --workers 1): the standard CPU-hungry workload.
HUNGRY = [sys.executable, str(ROOT / "examples" / "cpu_hungry.py")]


def require_tool(name: str) -> str:
    """Path of an external tool. Missing: a failure under CI=true, a skip elsewhere."""
    path = shutil.which(name) or shutil.which(name, path=str(VENV_BIN))
    if path:
        return path
    message = f"{name} is not installed (make test installs it)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def stopped(pid: int) -> bool:
    """The process is in job-control stop (state T), as SIGSTOP leaves it; one traced
    (t) or gone is not. Read straight from /proc: tests poll it every millisecond."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    # The command name may hold spaces or parentheses: the state follows the last ')'.
    return data[data.rfind(b")") + 2:data.rfind(b")") + 3] == b"T"


def wait_for(predicate: Callable[[], object], timeout: float = 10.0,
             interval: float = 0.02, what: str = "condition") -> object:
    """Poll until `predicate()` is truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def throttledjob_cmd() -> list[str]:
    """The installed console script, as a user runs it."""
    return [str(VENV_BIN / "throttledjob")]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/cluster/ needs the Kubernetes cluster the suite builds
    (marker `cluster`): `make fast` leaves them out."""
    cluster_dir = ROOT / "tests" / "cluster"
    for item in items:
        if cluster_dir in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.cluster)
