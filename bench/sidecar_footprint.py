"""Footprint of `throttledjob sidecar`: CPU (% of one core), resident memory, scrape latency.

    .venv/bin/python -m bench.sidecar_footprint [--seconds 60] [--gpus 8]

A real sidecar process runs at a 1 s interval with simulated GPUs (GPU and CPU targets
set, so both controllers run every cycle) watching a real half-core workload
(examples/cpu_hungry.py --pattern light). Phase 1 measures the sidecar's own CPU time
and RSS with nothing scraping it; phase 2 times /metrics scrapes (as Prometheus would
do them, one at a time). Targets from issue 3: <= 1% of a core, <= 40 MiB RSS,
< 10 ms per scrape.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

from testing.http import free_port
from testing.paths import ROOT, VENV_BIN

BIN = VENV_BIN / "throttledjob"


def scrape(url: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=5) as r:
        r.read()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="CPU/RSS window")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--enforcement", default="Cooperative",
                        choices=["Cooperative", "Signals", "Both"],
                        help="Signals adds the SIGSTOP/SIGCONT enforcer thread (50 ticks/s)")
    parser.add_argument("--json",
                        default=str(ROOT / "bench" / "out" / "sidecar_footprint.json"))
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="tj-footprint-"))
    (tmp / "shared").mkdir()
    policy = tmp / "policy.yaml"
    policy.write_text("targets: {cpu: {peak: 2}, gpu: {peakUtilizationPercent: 70, "
                      "peakPowerWatts: 250}}\nmaxSlowdown: 1.5\nintervalSeconds: 1\n"
                      f"enforcement: {args.enforcement}\n")
    work = subprocess.Popen([sys.executable, str(ROOT / "examples" / "cpu_hungry.py"),
                             "--pattern", "light", "--workers", "1", "--units", "1000000"],
                            start_new_session=True)
    port = free_port()
    env = {**os.environ, "THROTTLEDJOB_FAKE_GPUS": str(args.gpus),
           "THROTTLEDJOB_FAKE_GPU_TRACE": "plateau"}
    side = subprocess.Popen([str(BIN), "sidecar", "--policy", str(policy), "--shared-dir",
                             str(tmp / "shared"), "--host", "127.0.0.1", "--port", str(port),
                             "--gpu-backend", "fake", "--root-pid", str(work.pid)],
                            env=env, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 30
        while True:  # ready = the first cycle is published
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("sidecar did not become ready")
            time.sleep(0.1)
        proc = psutil.Process(side.pid)
        time.sleep(5)  # past start-up (imports, first cycles)
        t0, c0 = time.monotonic(), sum(proc.cpu_times()[:2])
        time.sleep(args.seconds)
        t1, c1 = time.monotonic(), sum(proc.cpu_times()[:2])
        rss = proc.memory_info().rss
        latencies = []
        for _ in range(args.scrapes):
            latencies.append(scrape(url))
            time.sleep(0.02)
        size = len(urllib.request.urlopen(url, timeout=5).read())
        latencies.sort()
        result = {
            "interval_seconds": 1.0, "fake_gpus": args.gpus, "enforcement": args.enforcement,
            "window_seconds": round(t1 - t0, 1),
            "cpu_percent_of_one_core": round(100 * (c1 - c0) / (t1 - t0), 3),
            "rss_mib": round(rss / 2**20, 1),
            "scrape_ms_median": round(1000 * statistics.median(latencies), 2),
            "scrape_ms_p99": round(1000 * latencies[int(0.99 * len(latencies)) - 1], 2),
            "metrics_bytes": size,
            "python": sys.version.split()[0],
        }
    finally:
        side.send_signal(signal.SIGTERM)
        side.wait(timeout=10)
        os.killpg(work.pid, signal.SIGKILL)
        work.wait()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
