"""Polling and external tools, as every test uses them."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable

import pytest

from testing.paths import VENV_BIN


def require_tool(name: str) -> str:
    """Path of an external tool. Missing: a failure under CI=true, a skip elsewhere."""
    path = shutil.which(name) or shutil.which(name, path=str(VENV_BIN))
    if path:
        return path
    message = f"{name} is not installed (make test installs it)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


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
