"""Issue 6 figures: an unmodified PyTorch script, paced by the injected hook vs signals.

    .venv/bin/python -m bench.torch_inject [--steps 1500] [--target 1.0] [--repeat 3]

Runs examples/torch_train.py unthrottled, under `throttledjob run --inject` and under
`--enforcement signals` at the same CPU target, side by side in one invocation.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from bench.harness import markdown, row, throttledjob_run
from testing.paths import ROOT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--target", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    cmd = [sys.executable, str(ROOT / "examples" / "torch_train.py"), "--steps", str(args.steps)]
    target = ["--cpu-peak", str(args.target), "--max-slowdown", "4"]
    cases = {
        "unthrottled": [],
        "--inject (optimizer-step pacing)": [*target, "--inject"],
        "--enforcement signals": [*target, "--enforcement", "signals"],
    }
    reports = {}
    for name, options in cases.items():
        runs = [throttledjob_run(options, cmd) for _ in range(args.repeat)]
        walls = [r["wall_seconds"] for r in runs]
        reports[name] = runs[walls.index(statistics.median_low(walls))]
    base = reports["unthrottled"]
    rows = [row(name, r, None if name == "unthrottled" else base) for name, r in reports.items()]
    for r, report in zip(rows, reports.values(), strict=True):
        r["steps"] = report["steps"]
    print(f"target {args.target} cores, {args.steps} optimizer steps\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
