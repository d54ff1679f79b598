"""Real Prometheus, real promtool, real throttled process: every exported metric is queryable.

`throttledjob run --metrics-port` holds examples/cpu_hungry.py to a CPU target with 2
simulated GPUs under a GPU target; a Prometheus server started here scrapes it every
second, and a PromQL query for every metric name the sidecar exposes must return data.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from testing import promserver
from testing.helpers import require_tool, wait_for
from testing.http import get
from testing.paths import HUNGRY, VENV_BIN


@pytest.fixture
def throttled_run() -> Iterator[str]:
    """A long `throttledjob run` with metrics on; yields its base URL."""
    with promserver.throttled_run(
            ["--cpu-peak", "1.2", "--gpu-peak-util", "70", "--gpu-peak-power", "250",
             "--gpu-memory-fraction", "0.8", "--max-slowdown", "1.6", "--gpu-backend", "fake"],
            [*HUNGRY, "--workers", "2", "--units", "100000"],
            env={"THROTTLEDJOB_FAKE_GPUS": "2", "THROTTLEDJOB_FAKE_GPU_TRACE": "plateau"},
    ) as url:
        yield url


@pytest.fixture
def prometheus(tmp_path, throttled_run) -> Iterator[str]:
    with promserver.prometheus(tmp_path, [throttled_run.removeprefix("http://")]) as url:
        yield url


promql = promserver.promql


def exported_names(metrics_text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(metrics_text) for s in f.samples}


def test_every_exported_metric_is_queryable_in_prometheus(prometheus, throttled_run):
    wait_for(lambda: promql(prometheus, 'up{job="throttledjob"} == 1'), timeout=30,
             what="a successful scrape")
    # Wait until the GPU controller has acted so that every series exists.
    wait_for(lambda: (json.loads(get(throttled_run + "/status")[1])["observed"]["throttleLevel"]
                      > 0), timeout=30, what="throttling to start")
    names = exported_names(get(throttled_run + "/metrics")[1])
    assert {"throttledjob_workload_cpu_cores", "throttledjob_gpu_utilization_ratio",
            "throttledjob_gpu_power_watts", "throttledjob_throttle_level_ratio",
            "throttledjob_cpu_target_cores", "throttledjob_gpu_utilization_target_ratio",
            "throttledjob_workload_cpu_seconds_total", "process_resident_memory_bytes"} <= names

    def missing() -> set[str]:
        return {n for n in names if not promql(prometheus, f'{n}{{job="throttledjob"}}')}

    wait_for(lambda: not missing(), timeout=30, what="every metric in Prometheus")
    # GPU series join dcgm-exporter's by gpu and UUID.
    util = promql(prometheus, "throttledjob_gpu_utilization_ratio")
    assert {r["metric"]["gpu"] for r in util} == {"0", "1"}
    assert all(r["metric"]["UUID"].startswith("GPU-") for r in util)
    # The real process is being held: a rate over the counter is a real CPU figure.
    wait_for(lambda: promql(prometheus, "rate(throttledjob_workload_cpu_seconds_total[5s]) > 0"),
             timeout=20, what="CPU rate")


def test_promtool_accepts_the_real_output(throttled_run):
    promtool = require_tool("promtool")
    wait_for(lambda: "throttledjob_gpu_utilization_ratio" in get(throttled_run + "/metrics")[1],
             timeout=20, what="GPU series")
    text = get(throttled_run + "/metrics")[1]
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                           text=True, timeout=30)
    assert check.returncode == 0 and not check.stdout.strip() and not check.stderr.strip(), \
        check.stdout + check.stderr
    # HELP on every family, utilization as _ratio everywhere.
    for family in text_string_to_metric_families(text):
        assert family.documentation, family.name
        assert "percent" not in family.name, family.name


def test_a_taken_metrics_port_fails_before_the_command_starts(tmp_path):
    marker = tmp_path / "started"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [str(VENV_BIN / "throttledjob"), "run", "--quiet", "--metrics-port", str(port),
             "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
            capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"cannot serve metrics on 127.0.0.1:{port}" in proc.stderr
    assert not marker.exists()
