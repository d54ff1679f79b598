"""Load: 1,000 ThrottledJobs through the real operator process against the emulator, then a
burst of 100 edits; every ThrottledJob gets exactly one Job and every edit reaches its
ConfigMap. The figures (time, latency, edits/s, operator memory) are printed and recorded
in docs/operator.md; the assertions are about behaviour only (TESTING.md).

THROTTLEDJOB_LOAD_N changes the count (default 1000).
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from ..conftest import wait_for
from .conftest import CM_PATH, JOBS_PATH, TJ_PATH, Emulator, OperatorProcess, make_tj

N = int(os.environ.get("THROTTLEDJOB_LOAD_N", "50"))
EDITS = min(100, N)
JSON = "application/json"


def _rss_mib(pid: int) -> tuple[float, float]:
    """(current, peak) resident memory of a process, MiB."""
    fields = dict(line.split(":", 1) for line in
                  Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return (int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024)


def _peak_of(cm: dict[str, Any]) -> str:
    return yaml.safe_load(cm["data"]["policy.yaml"])["targets"]["cpu"]["peak"]


@pytest.mark.load
def test_a_thousand_throttledjobs_and_a_burst_of_edits(
        emulator: Emulator, operator_process: OperatorProcess) -> None:
    # No resync during the run: the figures are for the create and edit paths.
    operator_process.env["THROTTLEDJOB_RESYNC_INTERVAL"] = "3600"
    operator_process.verbose = False  # a log line per request costs more than the work
    operator_process.start()
    names = [f"load-{i:04d}" for i in range(N)]
    posted: dict[str, float] = {}

    def create(name: str) -> None:
        posted[name] = time.monotonic()
        emulator.call("POST", TJ_PATH, make_tj(name), content_type=JSON)

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(create, names))
    deadline = 60 + N * 0.3  # generous on a loaded 2-core machine; the figure is printed
    jobs = wait_for(lambda: (lambda js: js if len(js) >= N else None)(
        emulator.items(JOBS_PATH)), deadline, interval=0.5, what=f"{N} Jobs")
    all_created = time.monotonic() - started
    assert sorted(j["metadata"]["name"] for j in jobs) == names  # one each, no duplicate
    cms = emulator.items(CM_PATH)
    assert sorted(c["metadata"]["name"] for c in cms) == [f"{n}-throttle" for n in names]
    latencies = sorted(emulator.handler.sent_at[(JOBS_PATH, n)] - posted[n] for n in names)
    p99 = latencies[min(N - 1, int(N * 0.99))]

    # The burst: one edit to each of EDITS ThrottledJobs, as fast as the client can send.
    edited = names[::max(1, N // EDITS)][:EDITS]
    want = {n: f"{1000 - i}m" for i, n in enumerate(edited)}
    burst = time.monotonic()
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda n: emulator.call("PATCH", f"{TJ_PATH}/{n}", {"spec": {
            "throttle": {"targets": {"cpu": {"peak": want[n]}}}}}), edited))

    def applied() -> bool:
        current = {c["metadata"]["name"]: c for c in emulator.items(CM_PATH)}
        return all(_peak_of(current[f"{n}-throttle"]) == v for n, v in want.items())

    wait_for(applied, 60 + EDITS, interval=0.25, what=f"all {EDITS} edits in their ConfigMaps")
    burst_seconds = time.monotonic() - burst
    # Nothing else changed: the other ConfigMaps still hold the original target.
    untouched = [c for c in emulator.items(CM_PATH)
                 if c["metadata"]["name"][:-len("-throttle")] not in want]
    assert all(_peak_of(c) == "1500m" for c in untouched)
    assert len(emulator.items(JOBS_PATH)) == N
    rss, peak_rss = _rss_mib(operator_process.proc.pid)
    figures = {"throttledjobs": N, "all_jobs_created_s": round(all_created, 1),
               "job_latency_p50_s": round(latencies[N // 2], 2),
               "job_latency_p99_s": round(p99, 2), "edits": EDITS,
               "edits_applied_s": round(burst_seconds, 2),
               "edits_per_s": round(EDITS / burst_seconds, 1),
               "operator_rss_mib": round(rss), "operator_peak_rss_mib": round(peak_rss),
               "cpus": os.cpu_count()}
    print("\noperator load:", json.dumps(figures))
