"""What the kernel quota's period costs a multi-threaded loop (docs/dev/benchmarks.md).

    .venv/bin/python -m bench.quota_period [--quota 1.0] [--periods 50 100] [--turns 2]
                                           [-- python examples/torch_train.py --steps 1000]

In turns, the command unthrottled and then held to `--quota` cores by a plain CFS quota
(`CgroupQuota`, nothing else of ours: no controller, no explorer) at each period. The
figure is the command's own time for its work (the `seconds=` it prints, start-up left
out) over the unthrottled turn's: a tree of width w held to Q cores would take w/Q of
it if the quota only delayed its work. What is over w/Q is CPU the quota made it waste.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys

from bench.harness import markdown
from testing.paths import ROOT
from throttledjob.sidecar.cpu.cgroups.detection import detect
from throttledjob.sidecar.cpu.cgroups.local_quota import CgroupQuota, QuotaBackend

DEFAULT = [sys.executable, str(ROOT / "examples" / "torch_train.py"), "--steps", "1000"]


def work_seconds(cmd: list[str], backend: QuotaBackend, quota: float | None,
                 period_ms: int) -> float:
    """The command's own `seconds=`, under `quota` cores per `period_ms` (None: none)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    with CgroupQuota(proc.pid, backend, period_us=period_ms * 1000) as q:
        q.set(quota)
        out, _ = proc.communicate()
    m = re.search(r'seconds"?[=:] ?([0-9.]+)', out)
    if proc.returncode or not m:
        raise SystemExit(f"{cmd} failed or printed no seconds: {out[-200:]}")
    return float(m.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quota", type=float, default=1.0)
    parser.add_argument("--periods", type=int, nargs="+", default=[50, 100],
                        help="periods in ms (ours: 50; a pod's limits.cpu: 100)")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    found = detect()
    if not found:
        raise SystemExit(f"no cgroup quota can be made here: {found.reason}")
    ratios: dict[int, list[float]] = {p: [] for p in args.periods}
    for _ in range(args.turns):
        base = work_seconds(cmd or DEFAULT, found.backend, None, 100)
        for p in args.periods:
            ratios[p].append(work_seconds(cmd or DEFAULT, found.backend, args.quota, p) / base)
            print(p, round(ratios[p][-1], 3), flush=True)
    print(markdown([{"period ms": p, "quota": args.quota,
                     "work time / unthrottled": "/".join(f"{r:.2f}" for r in rs),
                     "median": round(statistics.median(rs), 2)} for p, rs in ratios.items()]))


if __name__ == "__main__":
    main()
