"""The explorer's probes against the target, with the default slowdown budget (docs/benchmarks.md).

    .venv/bin/python -m bench.probes [--runs 3] [--steps 1500] [--target 1.0]

The unmodified PyTorch script (`examples/torch_train.py`, two threads, `--inject`) held
to a target its defaults need about 2x to meet, with the default `maxSlowdown` (1.25),
under cooperative pacing and under the kernel quota, `--runs` times each, beside one
unthrottled run. Per run: the most CPU any interval of the explorer's probes used (the
probes hold the target off the budget's books, so it must stay within the target's
bound, `summary.cpu_peak_bound`), how long they lasted, what the run settled on, the
real slowdown against the unthrottled run and the report's estimate of it.
"""

from __future__ import annotations

import argparse
import sys

from bench.harness import markdown, throttledjob_run
from testing.paths import ROOT
from throttledjob.sidecar.summary import cpu_peak_bound


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--target", type=float, default=1.0)
    args = parser.parse_args()
    cmd = [sys.executable, str(ROOT / "examples" / "torch_train.py"), "--steps", str(args.steps)]
    base = throttledjob_run([], cmd)
    bound = cpu_peak_bound(args.target)
    rows = []
    for run in range(args.runs):
        for enforcement in ("cooperative", "quota"):
            ours = throttledjob_run(["--cpu-peak", str(args.target), "--enforcement",
                                     enforcement, "--inject"], cmd)
            c = ours["controller"]
            probe_max = c["probe_max_cores"]
            rows.append({
                "run": run + 1, "enforcement": enforcement,
                "probe_s": c["probe_seconds"], "probe_max_cores": probe_max,
                "within_bound": probe_max is None or probe_max <= bound,
                "settled": (c["explorer"] or {}).get("levers", "-"),
                "p99": ours["cpu_peak_cores"],
                "budget_exhausted_s": c["budget_exhausted_seconds"],
                "real": round(ours["wall_seconds"] / base["wall_seconds"], 3),
                "estimate": c["estimated_slowdown"],
                "estimate_high": c["estimated_slowdown_high"],
            })
            print(rows[-1], flush=True)
    print(f"target {args.target} cores (bound {bound:.2f}), unthrottled "
          f"{base['wall_seconds']} s at p99 {base['cpu_peak_cores']} cores")
    print(markdown(rows))


if __name__ == "__main__":
    main()
