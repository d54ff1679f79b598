"""The operator under test: `throttledjob operator` as a real child process, exactly as a
user starts it, or, where kopf's watch and retries add nothing, a handler's memo to call
a handler directly with."""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from testing.helpers import wait_for
from testing.http import free_port
from testing.paths import VENV_BIN


class OperatorProcess:
    """`throttledjob operator --standalone` as a child process; restartable. Talks to
    whatever `kubeconfig` names: the emulator, or the real API server as some identity."""

    def __init__(self, kubeconfig: Path, workdir: Path, scope: tuple[str, ...] = ("-A",)) -> None:
        self.workdir = workdir
        # Test-sized defaults; a test may change them before start().
        self.env = {"THROTTLEDJOB_RESYNC_INTERVAL": "2", "THROTTLEDJOB_API_TIMEOUT": "5"}
        self.verbose = True
        self.status_interval = 0.5
        self.kubeconfig = kubeconfig
        self.scope = scope
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.port = 0

    def start(self) -> OperatorProcess:
        self.starts += 1
        self.port = free_port()
        log = open(self.workdir / f"operator-{self.starts}.log", "wb")  # noqa: SIM115
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "HOME": str(self.workdir),
               "KUBERNETES_SERVICE_HOST": "", **self.env}
        self.proc = subprocess.Popen(
            [str(VENV_BIN / "throttledjob"), "operator", "--standalone", *self.scope,
             *(["--verbose"] if self.verbose else []),
             "--status-interval", str(self.status_interval),
             "--liveness", f"http://127.0.0.1:{self.port}/healthz"],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.workdir)
        log.close()
        wait_for(self._live, timeout=30, what=f"operator liveness (see {self.log_text()})")
        return self

    def _live(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            pytest.fail(f"operator exited with {self.proc.returncode}:\n{self.log_text()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1):
                return True
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, as a crashed or evicted operator."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def full_log(self) -> str:
        return "".join(p.read_text(errors="replace")
                       for p in sorted(self.workdir.glob("operator-*.log")))

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-6000:]
                         for p in sorted(self.workdir.glob("operator-*.log")))


def handler_memo(kubeconfig: Path, **settings: Any) -> Any:
    """kopf's memo as the startup handler leaves it, for calling handlers directly: the
    OperatorState of test `settings` and a client logged in with `kubeconfig`."""
    import kopf

    from throttledjob.operator.config import OperatorSettings
    from throttledjob.operator.kube import Kube
    from throttledjob.operator.login import connection_info
    from throttledjob.operator.poller import OperatorState
    from throttledjob.operator.sidecar_status import HttpStatusReader

    ours = OperatorSettings(**settings)
    kube = Kube(lambda: connection_info(kubeconfig),
                timeout_seconds=ours.api_timeout_seconds)
    return kopf.Memo(state=OperatorState(ours, kube,
                                         HttpStatusReader(ours.status_timeout_seconds)))
