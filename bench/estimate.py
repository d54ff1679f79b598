"""The slowdown the report estimates against the real one, per workload (docs/benchmarks.md).

    .venv/bin/python -m bench.estimate [--scale 1.0] [--fraction 0.5] [--max-slowdown 3]

For each workload, side by side in one invocation: an unthrottled run (the same sampler,
`throttledjob run` with no target), then `throttledjob run --cpu-peak T` (T a fraction
of the unthrottled p99; the default enforcement, the kernel's quota, and `--inject` for
the unmodified PyTorch script). The real slowdown is the throttled wall over the
unthrottled wall; the estimate is the report's `controller.estimated_slowdown`; error is
estimate / real - 1 (negative: the report says it cost less than it did); estimate_high
is the top of the report's interval; probe_s the time the explorer's probes held the
target off the budget's books. With `--max-slowdown 1.25` (the default budget) the real
slowdown is judged against the budget.
"""

from __future__ import annotations

import argparse
import sys

from bench.harness import markdown, throttledjob_run
from testing.paths import HUNGRY, ROOT

ZOO = [sys.executable, str(ROOT / "bench" / "zoo.py")]


def workloads(scale: float) -> dict[str, tuple[list[str], list[str]]]:
    """name: (command, options of the throttled run beyond the target)."""
    return {
        "busy (2 processes)": ([*HUNGRY, "--units", str(int(150 * scale))], []),
        "matmul (zoo)": ([*ZOO, "matmul", "--scale", str(0.5 * scale)], []),
        "elementwise (zoo)": ([*ZOO, "elementwise", "--scale", str(0.5 * scale)], []),
        "torch_train.py (unmodified)": (
            [sys.executable, str(ROOT / "examples" / "torch_train.py"),
             "--steps", str(int(1500 * scale))], ["--inject"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the work")
    parser.add_argument("--fraction", type=float, default=0.5,
                        help="the target as a fraction of the unthrottled p99")
    parser.add_argument("--max-slowdown", default="3")
    args = parser.parse_args()
    rows = []
    for name, (cmd, options) in workloads(args.scale).items():
        base = throttledjob_run([], cmd)
        target = round(max(0.1, args.fraction * base["cpu_peak_cores"]), 2)
        ours = throttledjob_run(["--cpu-peak", str(target), "--max-slowdown",
                                 args.max_slowdown, *options], cmd)
        real = ours["wall_seconds"] / base["wall_seconds"]
        estimate = ours["controller"]["estimated_slowdown"]
        rows.append({"workload": name, "target": target,
                     "unthrottled_s": base["wall_seconds"], "throttled_s": ours["wall_seconds"],
                     "real": round(real, 3), "estimate": estimate,
                     "error": f"{estimate / real - 1:+.1%}",
                     # the interval's top (unknown lever costs at their worst)
                     "estimate_high": ours["controller"]["estimated_slowdown_high"],
                     "probe_s": ours["controller"]["probe_seconds"],
                     # over 0: the estimate left this much time's lever cost out
                     "unknown_cost_s": ours["controller"]["lever_cost_unknown_seconds"],
                     "p99": ours["cpu_peak_cores"],
                     "levers": ",".join(ours["controller"]["levers_used"]) or "-"})
        print(rows[-1], flush=True)
    print(markdown(rows))


if __name__ == "__main__":
    main()
