"""The slowdown the report estimates against the real one, per workload (docs/dev/benchmarks.md).

    .venv/bin/python -m bench.estimate [--scale 1.0] [--fraction 0.5] [--max-slowdown 3]
                                       [--repeat 3]

For each workload, side by side in one invocation: an unthrottled run (the same sampler,
`throttledjob run` with no target), then `throttledjob run --cpu-peak T` (T a fraction
of the unthrottled p99; the default enforcement, the kernel's quota, and `--inject` for
the unmodified PyTorch script). The real slowdown is the throttled wall over the
unthrottled wall; the estimate is the report's `controller.estimated_slowdown`; error is
estimate / real - 1 (negative: the report says it cost less than it did); estimate_high
is the top of the report's interval, high_covers how many pairs' real slowdown was at or
under it; probe_s the time the explorer's probes held the
target off the budget's books. With `--max-slowdown 1.25` (the default budget) the real
slowdown is judged against the budget.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from bench.harness import markdown, throttledjob_run
from testing.paths import HUNGRY, ROOT

ZOO = [sys.executable, str(ROOT / "bench" / "zoo.py")]


def workloads(scale: float) -> dict[str, tuple[list[str], list[str]]]:
    """name: (command, options of the throttled run beyond the target)."""
    return {
        "busy (2 processes)": ([*HUNGRY, "--units", str(int(150 * scale))], []),
        "matmul (zoo)": ([*ZOO, "matmul", "--scale", str(0.5 * scale)], []),
        "elementwise (zoo)": ([*ZOO, "elementwise", "--scale", str(0.5 * scale)], []),
        "bursty (zoo)": ([*ZOO, "bursty", "--scale", str(scale)], []),
        "torch_train.py (unmodified)": (
            [sys.executable, str(ROOT / "examples" / "torch_train.py"),
             "--steps", str(int(1500 * scale))], ["--inject"]),
        "gpt_train.py (unmodified)": (
            [sys.executable, str(ROOT / "examples" / "gpt_train.py"),
             "--iters", str(int(300 * scale))], ["--inject"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the work")
    parser.add_argument("--fraction", type=float, default=0.5,
                        help="the target as a fraction of the unthrottled p99")
    parser.add_argument("--max-slowdown", default="3")
    parser.add_argument("--repeat", type=int, default=1,
                        help="pairs per workload (unthrottled, throttled); medians reported")
    parser.add_argument("--only", nargs="+", metavar="WORD",
                        help="run only the workloads whose name contains one of these")
    parser.add_argument("--json", default=str(ROOT / "bench" / "out" / "estimate.json"),
                        help="where the raw reports go")
    args = parser.parse_args()
    rows, raw = [], []
    for name, (cmd, options) in workloads(args.scale).items():
        if args.only and not any(word in name for word in args.only):
            continue
        pairs = []
        for _ in range(args.repeat):
            base = throttledjob_run([], cmd)
            target = round(max(0.1, args.fraction * base["cpu_peak_cores"]), 2)
            ours = throttledjob_run(["--cpu-peak", str(target), "--max-slowdown",
                                     args.max_slowdown, *options], cmd)
            pairs.append((base, ours, target))
            raw.append({"workload": name, "unthrottled": base, "throttled": ours})
            print(name, base["wall_seconds"], ours["wall_seconds"],
                  ours["controller"]["estimated_slowdown"], flush=True)
        reals = [o["wall_seconds"] / b["wall_seconds"] for b, o, _ in pairs]
        estimates = [o["controller"]["estimated_slowdown"] for _, o, _ in pairs]
        errors = [e / r - 1 for e, r in zip(estimates, reals, strict=True)]
        highs = [o["controller"]["estimated_slowdown_high"] for _, o, _ in pairs]
        ours = pairs[-1][1]["controller"]
        rows.append({"workload": name, "target": pairs[-1][2],
                     "unthrottled_s": "/".join(f"{b['wall_seconds']:.1f}" for b, _, _ in pairs),
                     "real": round(statistics.median(reals), 3),
                     "estimate": round(statistics.median(estimates), 3),
                     # per pair, estimate / real - 1 (negative: the report says it cost
                     # less than it did)
                     "error": "/".join(f"{e:+.1%}" for e in errors),
                     # per pair, the top of the report's interval, and how many pairs'
                     # real slowdown it covered (at or under it)
                     "estimate_high": "/".join(f"{h:.3f}" for h in highs),
                     "high_covers": f"{sum(r <= h for r, h in zip(reals, highs, strict=True))}"
                                    f"/{len(pairs)}",
                     "probe_s": ours["probe_seconds"],
                     # over 0: the estimate left this much time's lever cost out
                     "unknown_cost_s": ours["lever_cost_unknown_seconds"],
                     "p99": pairs[-1][1]["cpu_peak_cores"],
                     "levers": ",".join(ours["levers_used"]) or "-"})
        print(rows[-1], flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(raw, indent=1))
    print(markdown(rows))

if __name__ == "__main__":
    main()
