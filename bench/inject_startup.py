"""What the injected runtime library costs every Python the workload starts.

    .venv/bin/python -m bench.inject_startup [--runs 30]

`inject: Auto` (and `throttledjob run --inject`) puts a sitecustomize.py on PYTHONPATH:
every interpreter of the workload loads it, torch or not (the shell's `python -c`, each
DataLoader worker spawned, every tool a script calls). Interpreter start with and without
it, side by side in one run, interleaved, the median of `--runs` each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from throttledjob.runtime.inject import write_library


def start_ms(env: dict[str, str]) -> float:
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    return (time.perf_counter() - began) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        shared = os.path.join(tmp, "shared")
        os.mkdir(shared)
        plain = {"PATH": os.environ["PATH"]}
        injected = {**plain, "PYTHONPATH": write_library(os.path.join(tmp, "lib")),
                    "THROTTLEDJOB_DIR": shared}
        times: dict[str, list[float]] = {"plain": [], "injected": []}
        for _ in range(args.runs):
            times["plain"].append(start_ms(plain))
            times["injected"].append(start_ms(injected))
    base = statistics.median(times["plain"])
    print("| interpreter start (`python -c pass`) | median ms | over plain |")
    print("|---|---|---|")
    for name, samples in times.items():
        ms = statistics.median(samples)
        print(f"| {name} | {ms:.1f} | {ms - base:+.1f} ms |")


if __name__ == "__main__":
    main()
