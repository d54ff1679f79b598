"""A CPU-hungry workload with a fixed amount of work, for the demo, tests and benchmarks.

    python examples/cpu_hungry.py --workers 2 --units 200            # saturating
    python examples/cpu_hungry.py --pattern bursty                    # bursts and waits
    python examples/cpu_hungry.py --pattern light                     # half a core
    python examples/cpu_hungry.py --cooperative                       # calls tj.step()

The work is a count of units (about 20 ms of CPU each), not a duration, so a throttled
run takes longer and the ratio of wall times is the slowdown.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time

UNIT_ITERATIONS = 250_000


def unit() -> int:
    """About 20 ms of pure-Python arithmetic on one core."""
    total = 0
    for i in range(UNIT_ITERATIONS):
        total += i * i % 7
    return total


def worker(units: int, pattern: str, cooperative: bool) -> None:
    step = _step_function(cooperative)
    done = 0
    while done < units:
        burst = units - done if pattern != "bursty" else min(units - done, 60)
        for _ in range(burst):
            started = time.perf_counter()
            unit()
            done += 1
            step()
            if pattern == "light":  # run half the time: half a core
                time.sleep(time.perf_counter() - started)
        if pattern == "bursty" and done < units:
            time.sleep(1.5)


def _step_function(cooperative: bool):
    if not cooperative:
        return lambda: None
    from throttledjob import runtime as tj

    return tj.step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--units", type=int, default=200, help="work units per worker")
    parser.add_argument("--pattern", choices=["saturate", "bursty", "light"], default="saturate")
    parser.add_argument("--cooperative", action="store_true", help="call tj.step() per unit")
    parser.add_argument("--inline", action="store_true",
                        help="one worker in this process, no child (for per-process limiters)")
    args = parser.parse_args()
    if args.inline:
        worker(args.units, args.pattern, args.cooperative)
        return
    procs = [multiprocessing.Process(target=worker, args=(args.units, args.pattern,
                                                          args.cooperative))
             for _ in range(args.workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    raise SystemExit(max(p.exitcode or 0 for p in procs))


if __name__ == "__main__":
    main()
