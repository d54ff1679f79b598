"""A real Prometheus server and a real `throttledjob run --metrics-port`, for tests.

Shared by tests/sidecar/test_prometheus.py (every exported metric is queryable) and
tests/chart/test_dashboard.py (every dashboard query returns data).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from testing.helpers import require_tool, wait_for
from testing.http import free_port, get
from testing.paths import VENV_BIN
from testing.processes import stop


@contextlib.contextmanager
def throttled_run(args: Sequence[str], command: Sequence[str],
                  env: Mapping[str, str] | None = None) -> Iterator[str]:
    """`throttledjob run --quiet --metrics-port PORT ARGS -- COMMAND`; yields its base URL
    once /readyz answers; always stopped (SIGTERM is forwarded to the command)."""
    port = free_port()
    proc = subprocess.Popen(
        [str(VENV_BIN / "throttledjob"), "run", "--quiet", "--metrics-port", str(port),
         *args, "--", *command],
        env={**os.environ, **(env or {})}, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: get(url + "/readyz")[0] == 200 or proc.poll() is not None,
                 timeout=20, what="run's /readyz")
        assert proc.poll() is None, f"throttledjob run exited with {proc.returncode}"
        yield url
    finally:
        stop(proc, timeout=20)
        # Workers of the command may outlive it: the whole session goes.
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def prometheus(workdir: Path, targets: Sequence[str], job: str = "throttledjob",
               labels: Mapping[str, str] | None = None,
               scrape_interval: str = "1s",
               scrape_configs: Sequence[Mapping] | None = None,
               binary: str | None = None, unlabelled: str | None = None) -> Iterator[str]:
    """A real Prometheus (Debian's, or `binary`) on 127.0.0.1 scraping `targets`
    ("host:port") as `job`, with `labels` on every series (what a PodMonitor's
    relabelings add), or `scrape_configs` as given; and with `unlabelled`, the same
    targets again as that job, with no labels (a second scrape configuration of the
    cluster: annotations, another team's); yields its URL."""
    binary = binary or require_tool("prometheus")
    port = free_port()
    config = workdir / "prometheus.yml"
    if scrape_configs is None:
        scrape_configs = [{"job_name": job, "static_configs": [
            {"targets": list(targets), "labels": dict(labels or {})}]}]
        if unlabelled:
            scrape_configs.append({"job_name": unlabelled,
                                   "static_configs": [{"targets": list(targets)}]})
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": list(scrape_configs),
    }))
    proc = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'prom-data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: get(url + "/-/ready")[0] == 200, timeout=30, what="Prometheus ready")
        yield url
    finally:
        stop(proc, timeout=20)


def promql(url: str, query: str, at: float | None = None) -> list[dict]:
    """The result of an instant query (now, or at the Unix time `at`); fails the test on
    a PromQL error."""
    params = {"query": query, **({"time": f"{at:.3f}"} if at is not None else {})}
    code, body = get(f"{url}/api/v1/query?" + urllib.parse.urlencode(params))
    assert code == 200, f"{query}: {body}"
    return json.loads(body)["data"]["result"]
