"""Benchmarks of bench/ run as `make bench` runs them, for the smoke tests: a module run
from the root, its output's markdown tables read back."""

from __future__ import annotations

import subprocess
import sys

from testing.paths import ROOT


def run_benchmark(name: str, *args: str, timeout: float = 240.0) -> str:
    """`python -m bench.NAME ARGS` from the root; its stdout, once it exits 0."""
    proc = subprocess.run([sys.executable, "-m", f"bench.{name}", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"bench.{name} exited {proc.returncode}:\n" \
                                 f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of each row of the markdown table whose header row starts with `header`
    (its separator row left out)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(header)), None)
    assert start is not None, f"no table headed {header!r} in:\n{text[-3000:]}"
    assert set(lines[start + 1]) <= set("|-"), lines[start + 1]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows
