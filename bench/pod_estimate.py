"""The slowdown a pod's /status estimates against the real one (docs/dev/benchmarks-history.md, "The
estimate in a pod").

The docs' PyTorch example (`examples/one-machine/pytorch.yaml`: `inject: Auto`, 1 core,
`maxSlowdown: 2`) on the real node of the one-machine cluster, beside the same container
with no limit: the real slowdown is the ThrottledJob's container time over the unlimited
one's (the kubelet's timestamps, to the second; the script's own training seconds
beside it), the estimate and its top the ThrottledJob's `status.observed` (`slowdown`,
`slowdownHigh`). One run per row, side by side in one namespace.

    .venv/bin/python -m bench.pod_estimate [--runs 3]

The runs are tests/cluster/test_end_to_end_live.py's PyTorch test (one implementation:
its cluster, chart and image fixtures) under THROTTLEDJOB_POD_ESTIMATE, which adds the
unlimited pod and writes the figures to bench/out/pod_estimate.json; the suite runs it
without. It starts the suite's cluster (or uses `make cluster`'s).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from bench.harness import markdown
from testing.paths import ROOT, VENV_BIN

FIGURES = ROOT / "bench" / "out" / "pod_estimate.json"
TEST = "tests/cluster/test_end_to_end_live.py::" \
       "test_an_unmodified_pytorch_script_is_paced_at_its_optimizer_steps_and_beats_a_plain_limit"


def row(figures: dict) -> dict:
    real, estimate = figures["real"], figures["estimate"]
    return {"real (training)": f"{real:.3f} ({figures['real_training']:.3f})",
            "estimate": estimate, "error": f"{estimate / real - 1:+.1%}" if estimate else "-",
            "top": figures["top"],
            "top covers": "yes" if figures["top"] and figures["top"] >= real else "no",
            "unlimited_s": figures["unlimited_s"], "throttled_s": figures["throttled_s"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pod_estimate",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    env = {**os.environ, "THROTTLEDJOB_POD_ESTIMATE": "1"}
    rows, code = [], 0
    for _ in range(args.runs):
        FIGURES.unlink(missing_ok=True)
        code = subprocess.run([str(VENV_BIN / "python"), "-m", "pytest", "-q", "-s", "-p",
                               "no:cacheprovider", TEST], cwd=ROOT, env=env).returncode or code
        if FIGURES.is_file():
            rows.append(row(json.loads(FIGURES.read_text())))
    if not rows:
        print("no figures: the runs failed before the end", file=sys.stderr)
        return code or 1
    print(markdown(rows))
    return code


if __name__ == "__main__":
    sys.exit(main())
