"""Run commands under `throttledjob run` (or another limiter) and collect what it measured.

Every case, throttled or not, is measured by the same sampler (`throttledjob run` with or
without a target), so the columns of a table compare like with like.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile

from testing.paths import ROOT, VENV_BIN


def throttledjob_run(options: list[str], cmd: list[str]) -> dict:
    """Run `cmd` under `throttledjob run OPTIONS`; returns its JSON report."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        # From the root, so a command may be a module of this repository (`-m bench.quota`).
        proc = subprocess.run([str(VENV_BIN / "throttledjob"), "run", "--quiet", "--report",
                               report, *options, "--", *cmd], capture_output=True, text=True,
                              cwd=ROOT)
        if proc.returncode != 0:
            raise RuntimeError(f"{cmd} failed ({proc.returncode}): {proc.stderr.strip()}")
        with open(report) as f:
            return json.load(f)


def row(name: str, report: dict, baseline: dict | None) -> dict:
    """One table row: the figures every benchmark reports."""
    wall = report["wall_seconds"]
    return {
        "case": name,
        "wall_s": wall,
        "slowdown": round(wall / baseline["wall_seconds"], 3) if baseline else 1.0,
        "p99_cores": report["cpu_peak_cores"],
        "max_cores": report["cpu_max_cores"],
        "mean_cores": report["cpu_mean_cores"],
        "levers": ",".join(report["controller"]["levers_used"]) or "-",
    }


def markdown(rows: list[dict]) -> str:
    if not rows:
        return ""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)
