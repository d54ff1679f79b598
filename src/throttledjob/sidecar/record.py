"""The record of a control cycle: what the agent saw, decided and did, and the run's totals.

Every reader (the summary, /status, metrics, the report, the status line) reads this
record, never the agent: a field is added here and where it is filled (sidecar/agent.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from throttledjob.contracts.policy import Policy

from .cpu.cgroups.throttling import ThrottleStats
from .cpu.enforcement import Plan
from .cpu.lever_settings import LeverSetting
from .cpu.measure import Pace
from .stats import PeakSummary

if TYPE_CHECKING:
    from .gpu_agent import GpuState


@dataclass(frozen=True)
class LastCycle:
    """What the last cycle saw and did (for the status line, metrics and /status).

    ("Status" is kept for the ThrottledJob's status and the sidecar's /status document.)"""

    usage_cores: float = 0.0
    rate_cores: float | None = None  # the rate the actuators hold the workload to
    pause_fraction: float = 0.0
    throttling: bool = False
    budget_exhausted: bool = False
    cooperating_pids: list[int] = field(default_factory=list)
    steps: int = 0
    enforcer_armed: bool = False
    error: str | None = None
    # Hold-back fraction the GPU controller asks for (None: no GPU target or no GPU).
    gpu_duty: float | None = None
    # In a pod: the workload's summed CPU limit the slowdown budget needs, over the
    # target's (None: the target's will do). The operator applies it (pods/resize).
    cpu_limit_wanted_cores: float | None = None
    # In a pod: cores each workload container wanted in the last interval, by name; the
    # operator splits the pod's limit by it.
    cpu_demand_cores: dict[str, float] = field(default_factory=dict)
    # The workload's pace and CPU cost of a step, over contracts.status.PACE_WINDOW_SECONDS.
    pace: Pace = field(default_factory=Pace)


@dataclass(frozen=True)
class CycleResult:
    """The agent after a cycle: what it saw and did, and the run's totals so far.

    Everything a reader needs to summarise the run (sidecar/summary.py) is here, copied,
    so a reader on another thread never sees a half-updated agent.
    """

    time: float                     # the agent's clock at the cycle (monotonic seconds)
    wall_seconds: float             # since the agent started
    policy: Policy
    plan: Plan                      # how the CPU target is held (sidecar/cpu/enforcement.py)
    last: LastCycle
    cycle_seconds: float            # how long the cycle itself took
    cpu_seconds: float              # the workload's CPU time so far
    processes: int                  # processes counted as the workload
    cpu: PeakSummary                # of 1-second CPU samples, in cores
    signal_paused_seconds: float    # time the enforcer held the workload back
    cooperative_paused_seconds: float  # time the runtime paced itself
    budget_exhausted_seconds: float
    levers: LeverSetting            # the cooperative levers in force (settings.json)
    controller_rate: float | None  # the CPU controller's rate (None: no CPU target)
    kernel_throttling: ThrottleStats | None  # cpu.stat of the kernel quota, where one holds
    gpu: GpuState | None
    # Time the levers in force cost by themselves (fewer threads, smaller batches: slower
    # steps no pause shows), from the explorer's measured unthrottled rate.
    lever_cost_seconds: float = 0.0
    # Busy time under lever settings whose own cost was never measured: not in
    # lever_cost_seconds, so the slowdown is a lower bound while this is over 0.
    lever_cost_unknown_seconds: float = 0.0
    # The most the levers run so far can have cost: each setting at the most it can cost
    # (lever_time.LeverTime.bound).
    lever_cost_bound_seconds: float = 0.0
    # Wall time the explorer's probes held the target off the budget's books, and the
    # most CPU an interval of it used (None: no probe yet).
    probe_seconds: float = 0.0
    probe_max_cores: float | None = None
    # Time a kernel quota that is not ours held the workload back (in a pod: the
    # containers' CPU limits, seen through ContainerQuota).
    kernel_paused_seconds: float = 0.0
    # The budget stood in a target's way within the window over which the target is
    # judged (stats.RECENT_SAMPLES seconds): a target missed in that window is missed
    # because of the budget, even where the last interval alone no longer shows it.
    budget_exhausted_recently: bool = False
    # Why, the last time in that window (decide.budget_reason); None while it did not.
    budget_reason: str | None = None
