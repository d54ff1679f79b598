"""What feeds simulated GPUs: the workload's state that real GPUs see for themselves.

A real board idles when its feeder is held back; a simulated one must be told. The
GpuBackend interface carries no such hook (the NVML adapter has no use for it): the
fake reads a `load` it was given at construction, and this module supplies it, from a
test harness (`drive`) or from a live run's GPU agent (`follow`).
"""

from __future__ import annotations

from dataclasses import dataclass

from throttledjob.gpu.fake import FakeGpuBackend, SimulatedLoad

from .gpu_agent import GpuAgent


def follow(agent: GpuAgent) -> None:
    """Let simulated GPUs behind `agent` see what it does to the workload: the hold-back
    of the interval each read reports, the memory fraction of the policy in force, and
    whether the workload has stepped yet.
    Nothing to do for real GPUs."""
    backend = agent.backend
    if isinstance(backend, FakeGpuBackend):
        backend.load = lambda: SimulatedLoad(agent.hold_back,
                                             agent.policy.gpu_memory_fraction,
                                             stepped=agent.steps_seen > 0)


@dataclass(frozen=True)
class SimulatedInterval:
    power_watts: float      # the busiest GPU
    duty: float             # hold-back in force
    speed: float            # work done, as a fraction of the unthrottled rate
    limit_watts: float      # the first GPU's power limit in force


def drive(agent: GpuAgent, gpu: FakeGpuBackend, intervals: int,
          steps_per_second: float = 100.0) -> list[SimulatedInterval]:
    """Run a GPU agent against the simulator with a perfect actuator (the duty it asks
    for is the hold-back in force next interval), the workload reporting its steps."""
    duty, rows = 0.0, []
    for _ in range(intervals):
        gpu.feed(duty)
        speed, limit = gpu.speed(), gpu.limits[0]
        next_duty = agent.cycle(1.0, duty, [], steps=steps_per_second * speed) or 0.0
        rows.append(SimulatedInterval(max(r.power_watts or 0.0 for r in agent.readings),
                                      duty, speed, limit))
        duty = next_duty
    return rows
