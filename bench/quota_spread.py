"""What a plain kernel CPU quota looks like through 1-second samples (docs/dev/benchmarks.md).

    .venv/bin/python -m bench.quota_spread [--runs 8] [--seconds 40] [--cores 1.0]

The baseline every peak bound in the suite is judged against: `--workers` busy processes
born in a cgroup v1 pair (cpu: quota = cores x 100 ms per 100 ms period, as the kubelet
writes a container's `limits.cpu`; cpuacct: its CPU time), sampled every second from
outside exactly as the end-to-end suite samples a container (tests/cluster: cpuacct.usage,
the time taken next to the read). Each run prints the p99 and maximum of its samples in
cores; the last line is the spread over all runs. Needs root and cgroup v1 cpu/cpuacct
(this machine's layout).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from throttledjob.sidecar.stats import nearest_rank

PERIOD_US = 100_000
BUSY = "while True: pass"


def _cgroup(controller: str, name: str) -> Path:
    path = Path("/sys/fs/cgroup") / controller / name
    path.mkdir(exist_ok=True)
    return path


def one_run(cores: float, seconds: float, workers: int, name: str) -> list[float]:
    """1-second samples (cores) of `workers` busy processes under a quota of `cores`."""
    cpu, acct = _cgroup("cpu", name), _cgroup("cpuacct", name)
    (cpu / "cpu.cfs_period_us").write_text(str(PERIOD_US))
    (cpu / "cpu.cfs_quota_us").write_text(str(int(cores * PERIOD_US)))
    # Each child joins both cgroups before it runs a single instruction of the workload.
    join = (f"import os; open('{cpu}/cgroup.procs','w').write(str(os.getpid())); "
            f"open('{acct}/cgroup.procs','w').write(str(os.getpid()))\n")
    procs = [subprocess.Popen([sys.executable, "-c", join + BUSY]) for _ in range(workers)]
    samples: list[float] = []
    try:
        time.sleep(0.5)
        if any(p.poll() is not None for p in procs):
            sys.exit("a busy process ended at once: cannot measure the quota")
        last_ns, last_t = None, time.monotonic()
        end = last_t + seconds
        while last_t < end:
            time.sleep(max(0.0, last_t + 1.0 - time.monotonic()))
            before = time.monotonic()
            ns = int((acct / "cpuacct.usage").read_text())
            now = (before + time.monotonic()) / 2
            if last_ns is not None:
                samples.append((ns - last_ns) / 1e9 / (now - last_t))
            last_ns, last_t = ns, now
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for path in (cpu, acct):
            os.rmdir(path)
    return samples[1:]  # the first second holds the start-up


def p99(samples: list[float]) -> float:
    """Nearest rank, as the sidecar and the suite read it: never above the largest sample
    (statistics.quantiles' default extrapolates past it on fewer than 99 samples)."""
    return nearest_rank(samples, 0.99) or 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--cores", type=float, default=1.0)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    runs = []
    for i in range(args.runs):
        s = one_run(args.cores, args.seconds, args.workers, f"tj-spread-{os.getpid()}")
        runs.append({"p99": p99(s), "max": max(s), "mean": statistics.mean(s), "n": len(s)})
        print(json.dumps({"run": i, **{k: round(v, 4) for k, v in runs[-1].items()}}),
              flush=True)
    ratios = [r["p99"] / args.cores for r in runs]
    maxima = [r["max"] / args.cores for r in runs]
    print(json.dumps({"cores": args.cores, "runs": len(runs),
                      "p99_over_target": [round(min(ratios), 4), round(max(ratios), 4)],
                      "max_over_target": [round(min(maxima), 4), round(max(maxima), 4)],
                      "load_average": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
