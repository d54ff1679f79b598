"""Foundation benchmarks (docs/dev/benchmarks.md): adherence, cost, cpulimit, overhead.

    make bench            # or: .venv/bin/python -m bench.run [--repeat N] [--scale F]

Every figure is a ratio between runs made side by side in this one invocation.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import timeit
from pathlib import Path

from bench.harness import markdown, row, throttledjob_run
from testing.paths import HUNGRY, ROOT

TARGET = 1.0
WORKLOADS = {
    # name: (arguments, work units, enforcement for our run, target cores)
    "saturating": ([], 250, "signals", TARGET),
    # cpulimit limits each process on its own (-m starts one limiter per child, each at
    # the full limit), so the side-by-side with it is one process at half a core.
    "saturating-1proc": (["--inline"], 150, "signals", 0.5),
    # Both: signals until the program calls step(), then pacing.
    "cooperative": (["--cooperative"], 250, "both", TARGET),
    "bursty": (["--pattern", "bursty"], 180, "both", TARGET),
    "under-target": (["--workers", "1", "--pattern", "light"], 150, "both", TARGET),
}
STEP_CALLS = 200_000


def cpulimit_cmd(cores: float, cmd: list[str]) -> list[str]:
    # -l: percent of one core; -m: follow the command's children; -f: run it in the
    # foreground. (-q detaches the children from cpulimit 2.8's watch: not used.)
    return ["cpulimit", "-l", str(int(cores * 100)), "-m", "-f", "--", *cmd]


def step_overhead(n: int = STEP_CALLS) -> dict:
    """Nanoseconds per step() call: no sidecar, a sidecar with no quota, with a quota."""
    setup = ("import os, tempfile, time\n"
             "from throttledjob.runtime import Throttle\n"
             "from throttledjob.contracts.settings import Settings, SETTINGS_FILE\n"
             "from throttledjob.runtime.files import write_json_atomic\n"
             "d = tempfile.mkdtemp()\n"
             "write_json_atomic(os.path.join(d, SETTINGS_FILE),"
             " Settings(seq=1, time=time.time(), cpu_quota_cores={quota},"
             " max_pause_fraction=0.5).to_dict())\n"
             "t = Throttle({directory})\n"
             "t.step()\n")
    out = {}
    for name, directory, quota in (("no sidecar", "''", None), ("sidecar, no quota", "d", None),
                                   ("sidecar, quota not reached", "d", 64.0)):
        timer = timeit.Timer("t.step()", setup.format(directory=directory, quota=quota))
        best = min(timer.repeat(repeat=5, number=n)) / n
        out[name] = round(best * 1e9)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs per case (median kept)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply the work (units per workload, step() calls timed)")
    parser.add_argument("--json", default=str(ROOT / "bench" / "out" / "foundation.json"))
    args = parser.parse_args()

    rows, checks = [], []
    for name, (extra, units, enforcement, target) in WORKLOADS.items():
        cmd = [*HUNGRY, *extra, "--units", str(max(1, round(units * args.scale)))]
        options = ["--cpu-peak", str(target), "--max-slowdown", "3"]
        cases = {"unthrottled": ([], cmd),
                 f"throttledjob ({enforcement})": ([*options, "--enforcement", enforcement],
                                                    cmd)}
        if name == "saturating-1proc":
            if not shutil.which("cpulimit"):
                sys.exit("cpulimit is missing: make tools installs it")
            cases[f"cpulimit -l {int(target * 100)}"] = ([], cpulimit_cmd(target, cmd))
        reports = {case: median_run(opts, c, args.repeat) for case, (opts, c) in cases.items()}
        base = reports["unthrottled"]
        for case, report in reports.items():
            r = row(f"{name}: {case}", report, None if case == "unthrottled" else base)
            r["target"] = target
            r["loop_cpu_pct"] = report["controller"]["loop_cpu_percent"]
            rows.append(r)
        base_row, ours = rows[-len(cases)], rows[-len(cases) + 1]
        checks += judge(name, target, base_row, ours, rows[-1] if len(cases) == 3 else None)
    overhead = step_overhead(max(1, round(STEP_CALLS * args.scale)))
    print(markdown(rows))
    print("\nstep() cost, ns per call (best of 5 x 200k):",
          ", ".join(f"{k}: {v}" for k, v in overhead.items()))
    print()
    for what, value, ok in checks:
        print(f"{'PASS' if ok else 'MISS'}  {what}: {value}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"rows": rows, "step_ns": overhead,
                                           "checks": checks}, indent=2))


def judge(name: str, target: float, base: dict, ours: dict, cpulimit: dict | None) -> list:
    """The foundation issue's targets, as (what, measured, met) triples."""
    checks = []
    if name != "under-target":
        checks.append((f"{name}: p99 <= 1.05 x target {target}", ours["p99_cores"],
                       ours["p99_cores"] <= 1.05 * target))
    if name == "saturating":
        bound = base["mean_cores"] / target
        checks.append((f"{name}: slowdown <= 1.05 x physical bound {bound:.3f}",
                       ours["slowdown"], ours["slowdown"] <= 1.05 * bound))
    if cpulimit:
        err, theirs = abs(ours["p99_cores"] - target), abs(cpulimit["p99_cores"] - target)
        checks.append((f"{name}: p99 error no worse than cpulimit's {theirs:.3f}",
                       round(err, 3), err <= theirs))
        checks.append((f"{name}: slowdown no worse than cpulimit's {cpulimit['slowdown']}",
                       ours["slowdown"], ours["slowdown"] <= cpulimit["slowdown"]))
    if name == "under-target":
        checks.append((f"{name}: slowdown <= 1.02", ours["slowdown"], ours["slowdown"] <= 1.02))
    return checks


def median_run(options: list[str], cmd: list[str], repeat: int) -> dict:
    runs = [throttledjob_run(options, cmd) for _ in range(repeat)]
    walls = [r["wall_seconds"] for r in runs]
    return runs[walls.index(statistics.median_low(walls))]


if __name__ == "__main__":
    main()
