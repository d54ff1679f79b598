"""A real `throttledjob sidecar` the tests started (tests/sidecar/conftest.py)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from testing.http import get_json


@dataclass
class Sidecar:
    proc: subprocess.Popen
    url: str
    policy: Path
    shared: Path

    def status(self) -> dict | None:
        return get_json(self.url + "/status")

    def stderr(self) -> str:
        return self.proc.stderr.read() if self.proc.stderr else ""
