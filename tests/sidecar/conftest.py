"""Fixtures for the sidecar: real processes, a real `throttledjob sidecar`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testing.http import free_port
from testing.paths import HUNGRY, VENV_BIN
from testing.processes import stop
from testing.sidecar_process import Sidecar


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen]]:
    """Start a command in a process group of its own; the whole group is killed after
    (multiprocessing workers outlive a terminated parent)."""
    procs: list[subprocess.Popen] = []

    def start(argv: list[str], env: dict | None = None) -> subprocess.Popen:
        p = subprocess.Popen(argv, start_new_session=True, env={**os.environ, **(env or {})})
        procs.append(p)
        return p

    yield start
    for p in procs:
        with contextlib.suppress(OSError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)


@pytest.fixture
def workload(spawn) -> Callable[..., subprocess.Popen]:
    """Start examples/cpu_hungry.py with these arguments, cleaned up as by `spawn`."""
    return lambda *args, env=None: spawn([*HUNGRY, *args], env=env)


@pytest.fixture
def sidecar(tmp_path) -> Iterator[Callable[..., Sidecar]]:
    """Start a real `throttledjob sidecar` watching one process tree; always stopped."""
    started: list[subprocess.Popen] = []

    def start(policy: str | Path, root_pid: int | None, *extra: str, env: dict | None = None,
              shared: Path | None = None, prefix: list[str] | None = None) -> Sidecar:
        """`policy` is YAML text, or the path of a policy file the test manages."""
        if isinstance(policy, Path):
            policy_file = policy
        else:
            policy_file = tmp_path / "policy.yaml"
            policy_file.write_text(policy)
        shared_dir = shared or tmp_path / "shared"
        shared_dir.mkdir(exist_ok=True)
        port = free_port()
        cmd = [*(prefix or []), str(VENV_BIN / "throttledjob"), "sidecar",
               "--policy", str(policy_file), "--shared-dir", str(shared_dir),
               "--host", "127.0.0.1", "--port", str(port), *extra]
        if root_pid is not None:
            cmd += ["--root-pid", str(root_pid)]
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **(env or {})})
        started.append(proc)
        return Sidecar(proc, f"http://127.0.0.1:{port}", policy_file, shared_dir)

    yield start
    for p in started:
        stop(p)
