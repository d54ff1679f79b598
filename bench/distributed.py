"""A job of many pods under one job-wide CPU target, against the even split a user writes.

Two ranks of examples/ddp_train.py (gloo, DistributedDataParallel), rank 1 costing about
twice rank 0 a step, as an Indexed Job on the real node of the one-machine cluster:

- even split: a plain Indexed Job, each pod at `limits.cpu: 500m`;
- job-wide: the same Job as a ThrottledJob's jobTemplate, `scope: Job`, 1 core.

Paired runs, the order alternating, each pair in the same cluster minutes apart; the
ratios of the job-wide run to the even split's (training time by the ranks' own clocks,
and the Job's wall time, which holds the pods' start) with their spread, and the p99 of
the two pods' summed CPU by the kernel's accounting.

    .venv/bin/python -m bench.distributed [--pairs 3]

The runs are tests/cluster/test_distributed_live.py's (one implementation: its cluster,
chart and image fixtures), which writes each pair's figures to bench/out/distributed.json;
this prints their table. It starts the suite's cluster (or uses `make cluster`'s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from bench.harness import markdown
from testing.paths import ROOT, VENV_BIN

FIGURES = ROOT / "bench" / "out" / "distributed.json"
TEST = "tests/cluster/test_distributed_live.py::" \
       "test_a_job_wide_target_splits_one_core_between_the_ranks_by_their_cost"


def table(pairs: list[dict]) -> str:
    rows = [{"pair": i, "training_ratio": round(p["training_ratio"], 3),
             "job_ratio": round(p["job_ratio"], 3),
             "even_training_s": round(p["even"]["training_seconds"], 1),
             "wide_training_s": round(p["wide"]["training_seconds"], 1),
             "even_job_s": p["even"]["job_seconds"], "wide_job_s": p["wide"]["job_seconds"],
             "even_p99_cores": round(p["even"]["p99_cores"], 3),
             "wide_p99_cores": round(p["wide"]["p99_cores"], 3)}
            for i, p in enumerate(pairs)]
    spread = []
    for key in ("training_ratio", "job_ratio"):
        values = [p[key] for p in pairs]
        spread.append(f"{key}: median {statistics.median(values):.3f}, "
                      f"min {min(values):.3f}, max {max(values):.3f}")
    return markdown(rows) + "\n\n" + "; ".join(spread)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.distributed",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args(argv)
    env = {**os.environ, "THROTTLEDJOB_DDP_PAIRS": str(args.pairs)}
    FIGURES.unlink(missing_ok=True)
    proc = subprocess.run([str(VENV_BIN / "python"), "-m", "pytest", "-q", "-s", "-p",
                           "no:cacheprovider", "--timeout", str(600 * args.pairs), TEST],
                          cwd=ROOT, env=env)
    if not FIGURES.is_file():
        print("no figures: the runs failed before the end", file=sys.stderr)
        return proc.returncode or 1
    print(table(json.loads(FIGURES.read_text())))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
