"""`throttledjob operator`: options, errors, and finding the cluster from KUBECONFIG."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from testing.paths import VENV_BIN


def run(*args: str, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "throttledjob"), "operator", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_help_lists_kopf_run_options() -> None:
    result = run("--help")
    assert result.returncode == 0
    for option in ("--standalone", "--all-namespaces", "--namespace", "--liveness",
                   "--peering", "--sidecar-image"):
        assert option in result.stdout


def test_a_scope_is_required() -> None:
    result = run("--standalone")
    assert result.returncode == 2
    assert "-A/--all-namespaces or -n/--namespace" in result.stderr


def test_all_namespaces_and_namespace_exclude_each_other() -> None:
    result = run("-A", "-n", "ml")
    assert result.returncode == 2 and "not allowed with" in result.stderr


def test_bad_interval_is_a_usage_error() -> None:
    result = run("-A", "--status-interval", "0")
    assert result.returncode == 2 and "--status-interval" in result.stderr


def test_no_cluster_is_a_clear_failure(tmp_path: Path) -> None:
    """No in-cluster account, no kubeconfig: the operator says it cannot log in."""
    result = run("-A", "--standalone", env={
        "KUBECONFIG": str(tmp_path / "missing"), "HOME": str(tmp_path),
        "KUBERNETES_SERVICE_HOST": ""}, timeout=60)
    assert result.returncode != 0
    assert "cannot find the cluster" in result.stderr, result.stderr[-2000:]


def test_flags_override_the_environment_in_the_handlers_memo(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI hands its flags to kopf.run in memo; the startup handler reads the
    environment once and puts both, flags on top, in the state the handlers share."""
    import kopf

    from throttledjob.cli import build_parser
    from throttledjob.operator import handlers
    from throttledjob.operator.main import run_operator

    runs: list[dict[str, Any]] = []
    monkeypatch.setattr(kopf, "run", lambda **kwargs: runs.append(kwargs))
    monkeypatch.setattr(kopf, "configure", lambda **kwargs: None)  # the test's logging stays
    monkeypatch.setattr(handlers, "connection_info",  # no cluster: nothing is called
                        lambda: kopf.ConnectionInfo(server="http://127.0.0.1:1"))
    monkeypatch.setenv("THROTTLEDJOB_SIDECAR_IMAGE", "env/image:1")
    monkeypatch.setenv("THROTTLEDJOB_STATUS_INTERVAL", "30")
    monkeypatch.setenv("THROTTLEDJOB_STATUS_TIMEOUT", "3")
    args = build_parser().parse_args(["operator", "-A", "--sidecar-image", "flag/image:2"])
    assert run_operator(args) == 0
    (memo,) = [kwargs["memo"] for kwargs in runs]
    handlers.configure(settings=kopf.OperatorSettings(), memo=memo,
                       logger=logging.getLogger("test"))
    try:
        ours = memo.state.settings
        assert (ours.sidecar_image, ours.status_interval_seconds,
                ours.status_timeout_seconds) == ("flag/image:2", 30.0, 3.0)
    finally:
        handlers.stop_poller(memo=memo)
