"""The workload zoo: a fixed amount of work per workload, steps reported through the runtime.

    python bench/zoo.py matmul            # saturating compute: scales with threads
    python bench/zoo.py elementwise       # memory-bandwidth bound: scales poorly
    python bench/zoo.py bursty            # compute bursts between idle waits
    python bench/zoo.py phases            # elementwise, then matmul, then elementwise
    python examples/torch_train.py        # the small CPU training loop (auto-hook), see WORKLOADS

Each workload calls `tj.step()` once per unit of work, so the runtime applies the
settings' thread cap to torch and paces the loop; with no sidecar it is a plain program.
At exit it prints one JSON line: steps, seconds, and the seconds spent at each torch
thread count (the levers actually in force, as seen from inside the workload).
`--scale` multiplies the amount of work.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# name: (command after the interpreter, extra `throttledjob run` options)
WORKLOADS: dict[str, tuple[list[str], list[str]]] = {
    "matmul": ([str(ROOT / "bench" / "zoo.py"), "matmul"], []),
    "elementwise": ([str(ROOT / "bench" / "zoo.py"), "elementwise"], []),
    "bursty": ([str(ROOT / "bench" / "zoo.py"), "bursty"], []),
    "torch_train": ([str(ROOT / "examples" / "torch_train.py"), "--steps", "5000",
                     "--width", "384"], ["--inject"]),
    "phases": ([str(ROOT / "bench" / "zoo.py"), "phases"], []),
}


class Clock:
    """Seconds spent at each torch thread count, sampled at every step."""

    def __init__(self, torch) -> None:
        self.torch = torch
        self.by_threads: dict[int, float] = {}
        self.last = time.perf_counter()

    def tick(self) -> None:
        now = time.perf_counter()
        n = self.torch.get_num_threads()
        self.by_threads[n] = self.by_threads.get(n, 0.0) + now - self.last
        self.last = now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=["matmul", "elementwise", "bursty", "phases"])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the work")
    args = parser.parse_args()

    import torch

    from throttledjob import runtime as tj

    torch.manual_seed(0)
    clock = Clock(torch)
    started, steps = time.perf_counter(), 0

    big_a, big_b = torch.randn(4_000_000), torch.randn(4_000_000)
    out = torch.empty_like(big_a)
    m = torch.randn(320, 320)

    def elementwise() -> None:
        # a few passes over 16 MB tensors: memory traffic, little arithmetic
        torch.mul(big_a, big_b, out=out)
        out.add_(big_a).mul_(0.5)

    def matmul() -> None:
        for _ in range(4):
            m.copy_(torch.tanh(m @ m))

    def run(fn, n: int) -> None:
        nonlocal steps
        for _ in range(n):
            fn()
            steps += 1
            tj.step()
            clock.tick()

    s = args.scale
    if args.workload == "matmul":
        run(matmul, int(12000 * s))
    elif args.workload == "elementwise":
        run(elementwise, int(8000 * s))
    elif args.workload == "bursty":
        for _ in range(10):
            run(matmul, int(600 * s))     # about a second of compute on 2 cores
            time.sleep(1.0)
            clock.tick()
    else:  # phases
        run(elementwise, int(4000 * s))
        run(matmul, int(6000 * s))
        run(elementwise, int(4000 * s))
    json.dump({"workload": args.workload, "steps": steps,
               "seconds": round(time.perf_counter() - started, 3),
               "seconds_by_threads": {str(k): round(v, 2)
                                      for k, v in sorted(clock.by_threads.items())}},
              sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
