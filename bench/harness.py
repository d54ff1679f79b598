"""Run commands under `throttledjob run` (or another limiter) and collect what it measured.

Every case, throttled or not, is measured by the same sampler (`throttledjob run` with or
without a target), so the columns of a table compare like with like.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from testing.paths import ROOT, VENV_BIN


def throttledjob_run(options: list[str], cmd: list[str], src: str | None = None) -> dict:
    """Run `cmd` under `throttledjob run OPTIONS`; returns its JSON report. With `src`,
    the `throttledjob` package is imported from that source tree (another checkout's
    `src`: the code before a change, run beside the code after it)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        # From the root, so a command may be a module of this repository (`-m bench.quota`).
        proc = subprocess.run([str(VENV_BIN / "throttledjob"), "run", "--quiet", "--report",
                               report, *options, "--", *cmd], capture_output=True, text=True,
                              cwd=ROOT, env=_with_src(src))
        if proc.returncode != 0:
            raise RuntimeError(f"{cmd} failed ({proc.returncode}): {proc.stderr.strip()}")
        with open(report) as f:
            return json.load(f)


def _with_src(src: str | None) -> dict[str, str] | None:
    if src is None:
        return None
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [src, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}


def row(name: str, report: dict, baseline: dict | None) -> dict:
    """One table row: the figures every benchmark reports."""
    wall = report["wall_seconds"]
    return {
        "case": name,
        "wall_s": wall,
        "slowdown": round(wall / baseline["wall_seconds"], 3) if baseline else 1.0,
        "p99_cores": report["cpu_peak_cores"],
        "max_cores": report["cpu_max_cores"],
        "mean_cores": report["cpu_mean_cores"],
        "levers": ",".join(report["controller"]["levers_used"]) or "-",
    }


def markdown(rows: list[dict]) -> str:
    if not rows:
        return ""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def machine_cpu_seconds() -> float:
    """CPU-seconds the whole machine has been busy (/proc/stat, all processes)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:8]]
    busy = sum(fields) - fields[3] - fields[4]   # less idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def busy_cores(seconds: float = 2.0) -> float:
    """Cores the whole machine kept busy over `seconds`: with nothing of a benchmark
    running, what others use."""
    before = machine_cpu_seconds()
    time.sleep(seconds)
    return (machine_cpu_seconds() - before) / seconds


def beside(run, *args, **kwargs) -> tuple[dict, float]:
    """`run(*args)`'s report and the cores the rest of the machine used meanwhile (all
    the machine's CPU less the run's own and its sampler's)."""
    before, began = machine_cpu_seconds(), time.monotonic()
    report = run(*args, **kwargs)
    wall = time.monotonic() - began
    ours = report["cpu_seconds"] + report["controller"].get("own_cpu_seconds", 0.0)
    return report, max(0.0, machine_cpu_seconds() - before - ours) / wall


def wait_idle(most: float = 0.15, poll: float = 30.0, give_up: float = 1800.0) -> float:
    """Wait until the machine beside us uses under `most` cores (another engineer's
    cluster or benchmark makes every timing worthless); returns the cores it used."""
    waited = 0.0
    while ((used := busy_cores()) >= most or _cluster_up()) and waited < give_up:
        print(f"machine busy ({used:.2f} cores beside us, a cluster up: {_cluster_up()}): "
              "waiting", file=sys.stderr, flush=True)
        time.sleep(poll)
        waited += poll
    return used


def _cluster_up() -> bool:
    """A local API server runs (`make cluster`, the cluster tests): its bursts come and go
    within a turn."""
    return subprocess.run(["pgrep", "-f", "kube-apiserver"], capture_output=True).returncode == 0


@contextlib.contextmanager
def a_cluster() -> Iterator[Any]:
    """The cluster `make cluster` left running (used, left running), else one of its own
    (tools/k8s/), built if need be and torn down after."""
    from tools.k8s import cluster as k8s

    shared = k8s.Cluster(ROOT / ".cluster")
    if shared.running():
        yield shared
        return
    k8s.build()
    own = k8s.Cluster(Path(tempfile.mkdtemp(prefix=k8s.TEMP_PREFIX))).up()
    try:
        yield own
    finally:
        own.down()
