"""A fleet GPU-watt budget (ThrottleBudget `gpu.peakWatts`) against an even split, on the
simulated board (no cluster, no GPU).

Three members of one simulated GPU each, of fixed work, that differ in what a power cap
costs them: one compute-bound at 95% utilization every second ("steady"), one light with
a burst every 20 seconds ("spike"), one ramping from 20% to 100% and back ("sawtooth").
Each is the sidecar's own GPU half (sidecar/gpu_agent.py: its power-cap lever on the
board, and the demand it reports, sidecar/gpu_demand.py) on its own board (gpu/fake.py:
power, clock and work under a cap). Run together two ways:
- even: each held Hard to a third of the budget;
- budget: split as the operator splits it (operator/fleet_split.py, each member's share
  through operator/fleet.held_power), every status interval, from each member's last
  300 seconds of demand; even until three reads are in, a member that ends leaves it.
Figures: each member's slowdown (its wall time over its work unheld), their sum (what the
split minimises), the last to finish, and the p99 of the boards' summed power each second
against the budget. The board is a model (its power law and clock-to-work are gpu/fake.py's),
so these figures are the split's on that model, not a real board's.

    .venv/bin/python -m bench.fleet_gpu
    .venv/bin/python -m bench.fleet_gpu --budget 500 --work 300
"""

from __future__ import annotations

import argparse
from collections import deque
from typing import Any

from bench.harness import markdown
from throttledjob.contracts.policy import parse_policy
from throttledjob.gpu.fake import MIN_LIMIT_WATTS, TDP_WATTS, FakeGpuBackend
from throttledjob.operator.budget_pass import MIN_READS
from throttledjob.operator.fleet import HISTORY, held_power
from throttledjob.operator.fleet_split import Member, split
from throttledjob.sidecar.gpu_agent import GpuAgent
from throttledjob.sidecar.stats import nearest_rank

TRACES = ("steady", "spike", "sawtooth")
INTERVAL = 10  # seconds between splits: the operator's default status interval
POLICY = {"maxSlowdown": 3.0, "levers": {"gpuPowerLimit": "Allow"}}


class Board:
    """One member: its sidecar's GPU half on its own simulated board, and its work done."""

    def __init__(self, trace: str, work: float) -> None:
        self.name, self.work, self.done = trace, work, 0.0
        self.gpu = FakeGpuBackend(1, trace)
        self.agent = GpuAgent(self.gpu, parse_policy(POLICY))
        self.demand: deque[float] = deque(maxlen=HISTORY)
        self.seconds = 0
        self.watts = 0.0

    def hold(self, share: float) -> None:
        """Its policy under a share of the budget, as the operator writes it."""
        self.agent.set_policy(parse_policy(held_power(POLICY, share, 1)))

    def second(self) -> None:
        """One second: the work it does under the cap in force, then the sidecar's cycle."""
        self.done += self.gpu.speed()
        self.agent.cycle(1.0, 0.0, [])
        state = self.agent.state()
        self.watts = state.readings[0].power_watts or 0.0
        if state.demand_watts is not None:
            self.demand.append(state.demand_watts)
        self.seconds += 1


def run(arm: str, budget: float, work: float) -> dict[str, Any]:
    boards = [Board(t, work) for t in TRACES]
    for b in boards:
        b.hold(budget / len(boards))
    summed, t = [], 0
    while any(b.done < b.work for b in boards):
        running = [b for b in boards if b.done < b.work]
        if arm == "budget" and t % INTERVAL == 0:
            members = [Member(b.name, tuple(b.demand) if t // INTERVAL >= MIN_READS else (),
                              MIN_LIMIT_WATTS) for b in running]
            for b, s in zip(running, split(budget, members).shares, strict=True):
                b.hold(s.cores)
        for b in running:
            b.second()
        summed.append(sum(b.watts for b in running))
        t += 1
    slowdowns = {b.name: b.seconds / work for b in boards}
    return {"arm": arm, **{f"{n} slowdown": round(s, 3) for n, s in slowdowns.items()},
            "sum of slowdowns": round(sum(slowdowns.values()), 3),
            "last to finish, s": max(b.seconds for b in boards),
            "p99 summed power, W": round(nearest_rank(summed, 0.99), 1), "budget, W": budget}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=600.0,
                        help=f"watts for the three boards (each draws up to {TDP_WATTS:g})")
    parser.add_argument("--work", type=float, default=600.0,
                        help="each member's work, in seconds of it unheld")
    args = parser.parse_args()
    rows = [run(arm, args.budget, args.work) for arm in ("even", "budget")]
    print(markdown(rows))
    even, ours = rows
    print(f"\nsum of slowdowns, budget / even: "
          f"{ours['sum of slowdowns'] / even['sum of slowdowns']:.3f}; last to finish: "
          f"{ours['last to finish, s'] / even['last to finish, s']:.3f}")


if __name__ == "__main__":
    main()
