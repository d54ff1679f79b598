"""The kernel's CPU quota, the baseline to beat (docs/benchmarks.md).

    .venv/bin/python bench/quota.py [--units 150] [--steps 400]

For two busy processes and an unmodified PyTorch loop, at 50/70/90% of the unthrottled
peak: a plain kernel quota at the target (what `resources.limits.cpu` gives a container:
the command is born in a cgroup with quota = target x 100 ms per 100 ms), the signal
enforcer (`throttledjob run --enforcement signals`), cpulimit where installed (for the
single-process torch loop only: see cpulimit_cmd), and
`sidecar/quota.py`'s CgroupQuota moving the running tree into a cgroup at a fixed quota
of 0.98 x target (the controller's setpoint, as local mode would drive it). Every case
runs under the same sampler (`throttledjob run --report`), side by side in one
invocation: read the ratios. Needs a writable cgroup cpu controller (root here).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import HUNGRY, ROOT, markdown, throttledjob_run

from throttledjob.sidecar.quota import CgroupQuota, detect

FRACTIONS = (0.5, 0.7, 0.9)
# The controller's setpoint in fixed mode (sidecar/controller.py): target x (1 - 2%).
SETPOINT = 0.98


def wrap(mode: str, cores: float, stats_file: str, cmd: list[str]) -> int:
    """Run `cmd` under a kernel quota; writes the kernel's throttling counters as JSON.

    plain: this wrapper joins the cgroup before starting `cmd`, so the command is inside
    from its first instruction, as in a container with a CPU limit. enforcer: `cmd` starts
    free and CgroupQuota moves its tree in right after, as the sidecar would.
    """
    found = detect()
    if not found:
        sys.exit(f"no cgroup quota: {found.reason}")
    # A SIGTERM (forwarded by `throttledjob run`) unwinds through close() below: no
    # cgroup is left behind by an interrupted benchmark.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if mode == "plain":
        q = CgroupQuota(os.getpid(), found.backend)
        q.set(cores)
        q.start()
        proc = subprocess.Popen(cmd)
    else:
        proc = subprocess.Popen(cmd)
        q = CgroupQuota(proc.pid, found.backend)
        q.start()
        q.set(cores)
    try:
        code = proc.wait()
        s = q.stats()
        paused = q.paused_seconds
    finally:
        q.close()
    Path(stats_file).write_text(json.dumps({
        "nr_periods": s.nr_periods, "nr_throttled": s.nr_throttled,
        "throttled_seconds": round(s.throttled_seconds, 3), "paused_seconds": round(paused, 3),
        "error": q.error, "backend": found.reason}))
    return code


def quota_case(mode: str, cores: float, cmd: list[str]) -> dict:
    """The sampler's report of `cmd` under a kernel quota, with the kernel's counters."""
    with tempfile.TemporaryDirectory() as tmp:
        stats = os.path.join(tmp, "stats.json")
        report = throttledjob_run([], [sys.executable, __file__, "--wrap", mode, str(cores),
                                       stats, "--", *cmd])
        report["kernel"] = json.loads(Path(stats).read_text())
    return report


def cpulimit_cmd(cores: float, cmd: list[str]) -> list[str]:
    # Never -m (follow children): on two busy processes it starts a limiter per child, each
    # at the full limit (it does not hold their total, bench/run.py), and here one 20 s
    # run of it forked about a thousand limiters. So only for one process: torch_train.py
    # (its threads are one process, which cpulimit stops and resumes as a whole).
    return ["cpulimit", "-l", str(round(cores * 100)), "-f", "--", *cmd]


def cpulimit_case(cores: float, cmd: list[str]) -> dict:
    # cpulimit 2.8 now and then dies of SIGSEGV as the watched process exits: one retry.
    for attempt in (1, 2):
        try:
            return throttledjob_run([], cpulimit_cmd(cores, cmd))
        except RuntimeError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def p99(samples: list[float]) -> float:
    """Nearest-rank 99th percentile, as the sampler's (with < 100 samples: the max)."""
    ranked = sorted(samples)
    return ranked[max(0, math.ceil(0.99 * len(ranked)) - 1)] if ranked else 0.0


def row(workload: str, case: str, target: float | None, report: dict, base: dict) -> dict:
    wall, peak = report["wall_seconds"], report["cpu_peak_cores"]
    # The first 1-second sample holds interpreter start-up, and for the kernel-quota rows
    # the wrapper's own start-up outside the cgroup: shown apart, as in the sections above.
    later = p99(report["cpu_recent_samples"][1:])
    paused = report.get("kernel", {}).get("paused_seconds",
                                          report["controller"]["signal_paused_seconds"])
    return {
        "workload": workload, "case": case, "target": target or "-",
        "wall_s": wall, "wall_ratio": round(wall / base["wall_seconds"], 3),
        "p99": peak, "p99/target": round(peak / target, 3) if target else "-",
        "p99_after_1st_s": later,
        "p99_after_1st_s/target": round(later / target, 3) if target else "-",
        "mean_cores": report["cpu_mean_cores"],
        "paused_s": round(paused, 2) if target else "-",
    }


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=150, help="work units per busy process")
    parser.add_argument("--steps", type=int, default=400, help="torch_train.py steps")
    parser.add_argument("--workloads", nargs="+", default=["busy", "torch"])
    parser.add_argument("--json", default=str(ROOT / "bench" / "out" / "quota.json"))
    parser.add_argument("--wrap", nargs=3, metavar=("MODE", "CORES", "STATS"),
                        help=argparse.SUPPRESS)
    parser.add_argument("cmd", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.wrap:
        mode, cores, stats = args.wrap
        sys.exit(wrap(mode, float(cores), stats, args.cmd))

    found = detect()
    if not found:
        sys.exit(f"no cgroup quota here: {found.reason}")
    workloads = {
        "2 busy processes": [*HUNGRY, "--workers", "2", "--units", str(args.units)],
        "torch_train.py": [sys.executable, str(ROOT / "examples" / "torch_train.py"),
                           "--steps", str(args.steps)],
    }
    chosen = {k: v for k, v in workloads.items()
              if ("busy" if "busy" in k else "torch") in args.workloads}
    have_cpulimit = shutil.which("cpulimit") is not None
    loads = [f"start {time.strftime('%H:%M:%S')} load {load()}"]
    print(f"enforcer backend: {found.reason}", file=sys.stderr)
    rows = []
    for name, cmd in chosen.items():
        base = throttledjob_run([], cmd)
        rows.append(row(name, "unthrottled", None, base, base))
        first = len(rows)
        peak = base["cpu_peak_cores"]
        for fraction in FRACTIONS:
            target = round(fraction * peak, 2)
            cases = {
                "kernel quota at target (limits.cpu)":
                    lambda t=target, c=cmd: quota_case("plain", t, c),
                "signals (--enforcement signals)":
                    lambda t=target, c=cmd: throttledjob_run(
                        ["--cpu-peak", str(t), "--enforcement", "signals",
                         "--max-slowdown", "10"], c),
                f"CgroupQuota at {SETPOINT} x target":
                    lambda t=target, c=cmd: quota_case("enforcer", round(SETPOINT * t, 3), c),
                "throttledjob run (default: quota + explorer)":
                    lambda t=target, c=cmd: throttledjob_run(
                        ["--cpu-peak", str(t), "--max-slowdown", "10"], c),
            }
            if have_cpulimit and name == "torch_train.py":
                cases["cpulimit"] = lambda t=target, c=cmd: cpulimit_case(t, c)
            for case, run in cases.items():
                try:
                    report = run()
                except RuntimeError as e:
                    print(f"{name} {fraction:.0%} {case}: failed: {e}", file=sys.stderr)
                    continue
                rows.append(row(name, f"{fraction:.0%}: {case}", target, report, base))
                print(json.dumps(rows[-1]), file=sys.stderr)
        # Measured again at the end: other work on a shared machine moves the baseline,
        # and the ratios use the mean of both (both shown).
        again = throttledjob_run([], cmd)
        rows.append(row(name, "unthrottled, again", None, again, base))
        mean_wall = (base["wall_seconds"] + again["wall_seconds"]) / 2
        for r in rows[first:-1]:
            r["wall_ratio"] = round(r["wall_s"] / mean_wall, 3)
        loads.append(f"after {name} {time.strftime('%H:%M:%S')} load {load()}")
    print(markdown(rows))
    print()
    print(f"enforcer backend: {found.reason}")
    print("cpulimit: " + ("installed (single-process torch rows only)" if have_cpulimit
                          else "not installed (rows left out)"))
    print("\n".join(loads))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"rows": rows, "load": loads,
                                           "backend": found.reason}, indent=2))


if __name__ == "__main__":
    main()
