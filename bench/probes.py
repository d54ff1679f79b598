"""The explorer's probes against the target, with the default slowdown budget
(docs/dev/benchmarks.md).

    .venv/bin/python -m bench.probes [--runs 3] [--steps 1500] [--target 1.0]

The unmodified PyTorch script (`examples/torch_train.py`, two threads, `--inject`) held
to a target its defaults need about 2x to meet, with the default `maxSlowdown` (1.25),
under cooperative pacing and under the kernel quota, `--runs` times each, beside one
unthrottled run. Per run: the most CPU any interval of the explorer's probes used (the
probes hold the target off the budget's books, so it must stay within the target's
bound, `summary.cpu_peak_bound`), how long they lasted, what the run settled on, the
real slowdown against the unthrottled run and the report's estimate of it.

    .venv/bin/python -m bench.probes --pay-off 600 3000 [--pairs 3] [--max-slowdown 3]
                                     [--before ../main/src]

Whether exploring pays on a run of that many steps: in turns, `--pairs` times, an
unthrottled run, `throttledjob run --cpu-peak T` without `--inject` (no step is reported,
so no explorer: the kernel quota alone, the budget's lift included), the same with
`--inject` (the explorer), and with `--before` the same again with the `throttledjob`
package of another source tree (the code before a change). Per run of the explorer, its
wall over the run without it beside it: the median of those ratios and their range.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from bench.harness import beside, markdown, throttledjob_run, wait_idle
from testing.paths import ROOT
from throttledjob.sidecar.summary import cpu_peak_bound


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--target", type=float, default=1.0)
    parser.add_argument("--pay-off", type=int, nargs="+", metavar="STEPS",
                        help="runs of these many steps: the explorer against none (above)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--max-slowdown", default="1.25")
    parser.add_argument("--before", help="a source tree holding the code before a change")
    parser.add_argument("--json", help="where the raw reports of --pay-off go")
    args = parser.parse_args()
    if args.pay_off:
        pay_off(args)
        return
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

# The most cores the rest of the machine may use during a turn of --pay-off (the
# sampler's own start-up and the harness read about 0.05 here when nothing else ran).
BESIDE = 0.15


def pay_off(args: argparse.Namespace) -> None:
    held = ["--cpu-peak", str(args.target), "--max-slowdown", args.max_slowdown]
    cases = {"no explorer": (held, None), "explorer": ([*held, "--inject"], None)}
    if args.before:
        cases["explorer, before"] = ([*held, "--inject"], args.before)
    rows, raw = [], []
    for steps in args.pay_off:
        cmd = [sys.executable, str(ROOT / "examples" / "torch_train.py"), "--steps", str(steps)]
        runs: dict[str, list[dict]] = {case: [] for case in ["unthrottled", *cases]}
        raw.append({"steps": steps, "runs": runs})
        while len(runs["unthrottled"]) < args.pairs:
            # In turns, so a change in the machine's speed meets every case alike; a turn
            # during which anything else on the machine used more than BESIDE cores is
            # run again (this machine is shared: such a turn's ratios are worthless).
            wait_idle(BESIDE)
            turn = {"unthrottled": beside(throttledjob_run, [], cmd)}
            for case, (options, src) in cases.items():
                turn[case] = beside(throttledjob_run, options, cmd, src=src)
            others = max(used for _, used in turn.values())
            print(steps, {case: r["wall_seconds"] for case, (r, _) in turn.items()},
                  f"beside: {others:.2f} cores", flush=True)
            if others >= BESIDE:
                continue
            for case, (report, _) in turn.items():
                runs[case].append(report)
        for case, reports in runs.items():
            walls = [r["wall_seconds"] for r in reports]
            # each run over the run without the explorer of the same turn
            ratios = sorted(w / n["wall_seconds"]
                            for w, n in zip(walls, runs["no explorer"], strict=True))
            c = [r["controller"] for r in reports]
            rows.append({
                "steps": steps, "case": case,
                "wall_s": "/".join(f"{w:.1f}" for w in walls),
                "real": round(statistics.median(
                    w / u["wall_seconds"] for w, u in zip(walls, runs["unthrottled"],
                                                          strict=True)), 3),
                "over no explorer": (f"{statistics.median(ratios):.3f} "
                                     f"({ratios[0]:.3f}-{ratios[-1]:.3f})"),
                "p99": max(r["cpu_peak_cores"] for r in reports),
                "probe_s": "/".join(f"{x['probe_seconds']:.0f}" for x in c),
                "settled": "/".join((x["explorer"] or {}).get("levers", "-") for x in c),
                "estimate": "/".join(f"{x['estimated_slowdown']}" for x in c),
            })
            print(rows[-1], flush=True)
    print(f"target {args.target} cores, maxSlowdown {args.max_slowdown}")
    print(markdown(rows))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
