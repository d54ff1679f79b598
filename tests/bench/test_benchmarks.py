"""Each benchmark of bench/ at a tiny size, run as `make bench` runs it: it must finish and
print its table, one row per case. Its figures are never judged here (at these sizes they
mean nothing): timing claims live in bench/ and docs/dev/benchmarks.md. The operator's load
benchmark needs the cluster: tests/cluster/test_bench_live.py."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from testing.benchmarks import run_benchmark, table_rows
from testing.helpers import require_tool
from throttledjob.sidecar.cpu.cgroups.detection import detect

pytestmark = pytest.mark.bench

# As tests/sidecar/test_quota.py: where the suite runs as root (CI), no quota is a failure.
needs_cgroup = pytest.mark.skipif(not detect() and not os.environ.get("CI"),
                                  reason="no writable cgroup cpu controller here")
CGROUP_V1 = all(Path("/sys/fs/cgroup", c).is_dir() for c in ("cpu", "cpuacct"))
needs_cgroup_v1 = pytest.mark.skipif(
    not (CGROUP_V1 and os.geteuid() == 0) and not os.environ.get("CI"),
    reason="needs root and the cgroup v1 cpu and cpuacct controllers")


def test_foundation(tmp_path: Path) -> None:
    require_tool("cpulimit")
    out = run_benchmark("run", "--scale", "0.02", "--json", str(tmp_path / "f.json"))
    # Five workloads, unthrottled and ours; cpulimit beside the one-process one.
    assert len(table_rows(out, "| case |")) == 11
    assert "step() cost, ns per call" in out
    assert len(json.loads((tmp_path / "f.json").read_text())["rows"]) == 11


def test_torch_inject() -> None:
    out = run_benchmark("torch_inject", "--steps", "20")
    cases = [row[0] for row in table_rows(out, "| case |")]
    assert cases == ["unthrottled", "--inject (optimizer-step pacing)",
                     "--enforcement signals"]


def test_frontier(tmp_path: Path) -> None:
    out = run_benchmark("frontier", "--quick", "--workloads", "matmul", "--scale", "0.003",
                        "--fractions", "0.5", "--json", str(tmp_path / "f.json"),
                        "--plots", str(tmp_path))
    assert [row[0] for row in table_rows(out, "| workload | peak P |")] == ["matmul"]
    assert [row[0] for row in table_rows(out, "| workload | target | ours:")] == ["matmul"]
    assert (tmp_path / "frontier-matmul.png").stat().st_size > 0


@needs_cgroup
def test_estimate() -> None:
    # Two of its six workloads: the plain quota and `--inject`; the others' commands are
    # the zoo's and torch_train.py's, which test_frontier and test_torch_inject run.
    out = run_benchmark("estimate", "--scale", "0.02", "--only", "busy", "gpt_train")
    assert [row[0] for row in table_rows(out, "| workload | target |")] == [
        "busy (2 processes)", "gpt_train.py (unmodified)"]


@needs_cgroup
def test_quota_period() -> None:
    out = run_benchmark("quota_period", "--turns", "1", "--periods", "50", "100", "--",
                        sys.executable, "examples/torch_train.py", "--steps", "5")
    assert [row[0] for row in table_rows(out, "| period ms |")] == ["50", "100"]


@needs_cgroup
def test_probes() -> None:
    out = run_benchmark("probes", "--runs", "1", "--steps", "20")
    assert [row[1] for row in table_rows(out, "| run | enforcement |")] == [
        "cooperative", "quota"]


def test_gpu_frontier(tmp_path: Path) -> None:
    out = run_benchmark("gpu_frontier", "--intervals", "30", "--json", str(tmp_path / "g.json"))
    # Five simulated workloads at three targets each, against the oracle and a locked clock.
    assert len(table_rows(out, "| workload | peak W |")) == 15
    assert len(table_rows(out, "| workload | target W | cap slowdown |")) == 15


def test_gpu_real_on_the_simulated_board(tmp_path: Path) -> None:
    out = run_benchmark("gpu_real", "--simulated", "--tiny", "--steps", "400",
                        "--json", str(tmp_path / "g.json"))
    cases = [row[0] for row in table_rows(out, "| case | measure |")]
    assert cases[:2] == ["unthrottled"] * 2
    assert [c.split()[0] for c in cases[2:]] == ["--gpu-peak-util", "--gpu-peak-power"]


def test_sidecar_footprint(tmp_path: Path) -> None:
    out = run_benchmark("sidecar_footprint", "--seconds", "1", "--scrapes", "5", "--gpus", "1",
                        "--json", str(tmp_path / "s.json"))
    figures = json.loads(out)
    assert {"cpu_percent_of_one_core", "rss_mib", "scrape_ms_median", "scrape_ms_p99",
            "metrics_bytes"} <= set(figures)
    assert json.loads((tmp_path / "s.json").read_text()) == figures


@needs_cgroup
def test_quota(tmp_path: Path) -> None:
    # 2.5 s unthrottled: 100 units ran 1.0 s on this CPU and raced the first 1-second sample.
    out = run_benchmark("quota", "--workloads", "busy", "--units", "250", "--fractions", "0.5",
                        "--json", str(tmp_path / "q.json"))
    cases = [row[1] for row in table_rows(out, "| workload | case |")]
    assert cases == ["unthrottled", "50%: plain quota (limits.cpu)", "50%: throttledjob run",
                     "50%: signals", "unthrottled, again"]
    assert [row[0] for row in table_rows(out, "| workload | target |")] == ["busy"]


@needs_cgroup_v1
def test_quota_spread() -> None:
    lines = [json.loads(line) for line in
             run_benchmark("quota_spread", "--runs", "1", "--seconds", "3").splitlines()]
    assert lines[0]["run"] == 0 and lines[0]["n"] >= 1
    assert lines[-1]["runs"] == 1 and len(lines[-1]["p99_over_target"]) == 2


def test_distributed_table() -> None:
    """bench/distributed.py's runs are the live test's (tests/cluster/); its table of the
    pairs that test writes: a row per pair and the ratios' median and spread."""
    from bench import distributed

    def run(training: float, job: float, p99: float) -> dict:
        return {"training_seconds": training, "job_seconds": job, "p99_cores": p99,
                "cpu_per_step": [0.028, 0.052]}

    pairs = [{"training_ratio": 0.8, "job_ratio": 0.9, "wide": run(40, 54, 1.0),
              "even": run(50, 60, 1.0)},
             {"training_ratio": 0.9, "job_ratio": 1.05, "wide": run(45, 63, 0.97),
              "even": run(50, 60, 1.01)}]
    text = distributed.table(pairs)
    rows = table_rows(text, "| pair | training_ratio |")
    assert [row[:3] for row in rows] == [["0", "0.8", "0.9"], ["1", "0.9", "1.05"]]
    assert "training_ratio: median 0.850, min 0.800, max 0.900" in text


def test_pod_estimate_row() -> None:
    """bench/pod_estimate.py's runs are the live PyTorch test's (tests/cluster/); its row
    of the figures that test writes: the error against the real slowdown, whether the top
    covers it."""
    from bench import pod_estimate

    figures = {"real": 1.2, "real_training": 1.25, "estimate": 1.08, "top": 2.0,
               "unlimited_s": 18.0, "throttled_s": 21.6}
    assert pod_estimate.row(figures) == {
        "real (training)": "1.200 (1.250)", "estimate": 1.08, "error": "-10.0%", "top": 2.0,
        "top covers": "yes", "unlimited_s": 18.0, "throttled_s": 21.6}
    assert pod_estimate.row({**figures, "top": 1.1})["top covers"] == "no"


def test_fleet_gpu() -> None:
    out = run_benchmark("fleet_gpu", "--work", "40")
    assert [r[0] for r in table_rows(out, "| arm |")] == ["even", "budget"]
    assert "sum of slowdowns, budget / even:" in out


def test_fleet_scale_and_cost_table() -> None:
    """bench/fleet.py: its scale part at 20 members prints its figures; its cost table of
    the runs the real node makes (tests/cluster/test_bench_live.py has no run of it: its
    cost runs are minutes) has a row per run and the ratios of the pairs' medians."""
    out = run_benchmark("fleet", "--members", "20")
    assert [r[0] for r in table_rows(out, "| figure | value |")] == [
        "members", "split_seconds_median", "split_seconds_max", "goal_seconds"]
    from bench import fleet

    def run(arm: str, saturating: float, slowdowns: float, last: float) -> dict:
        return {"arm": arm, "walls": {"saturating": saturating, "single": 17.0,
                                      "bursty": 41.0},
                "sum_slowdowns": slowdowns, "last_s": last, "p99_cores": 1.0}

    text = fleet.cost_table([run("even", 33, 5.5, 41), run("budget", 25, 4.4, 43),
                             run("budget", 29, 5.52, 43), run("even", 35, 5.52, 42)])
    assert len(table_rows(text, "| arm |")) == 4
    assert "sum_slowdowns: budget/even median 0.900; last_s: budget/even median 1.036" in text
