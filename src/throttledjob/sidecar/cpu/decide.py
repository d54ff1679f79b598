"""Decide: from one interval's `Sample`, the pacing rate the actuators hold the workload
to next, and whether the slowdown budget stands in a target's way (`budget_reason`,
the one definition: the metrics, /status, the report and the status line all read it,
over one window, through the agent's CycleResult).

No I/O: the controllers keep their own state (cpu/controller.py, gpu_controller.py), and
everything else comes in as arguments (the GPU half's duty among them), so each rule is
tested with hand-made samples (tests/sidecar/test_cycle_parts.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from throttledjob.contracts.policy import Policy

from ..stats import RECENT_SAMPLES
from .controller import BINDING_PAUSE_FRACTION, DEFAULT_MARGIN, CpuController, CpuObservation
from .enforcement import Plan, plan_as_written
from .measure import Sample


@dataclass(frozen=True)
class Decision:
    """One interval's verdict, frozen: what the actuators hold the workload to next, and
    what the budget says."""

    # The CPU rate (cores) the pacing and the enforcer hold the workload to; None: none.
    rate_cores: float | None
    # The GPU target's rate is the lower one: the GPU, not the CPU target, holds it back.
    gpu_bound: bool
    # A controller, or the kernel's quota, holds the workload back.
    throttling: bool
    # Why the slowdown budget stands in a target's way this interval; None: it does not
    # (budget_reason).
    budget_reason: str | None = None
    # In a pod: the containers' CPU limit the budget needs, over the target's (None: the
    # target's will do); the operator applies it.
    limit_wanted_cores: float | None = None

    @property
    def budget_exhausted(self) -> bool:
        return self.budget_reason is not None


class BudgetBook:
    """The budget's verdicts over the run: the time it stood in a target's way, and why
    the last time it did within the window a target is judged over (stats.RECENT_SAMPLES
    seconds): a target missed in that window is missed because of the budget, even where
    the last interval alone no longer shows it."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._at: float | None = None  # the last such interval's end
        self._reason: str | None = None

    def add(self, decision: Decision, now: float, elapsed: float) -> None:
        if decision.budget_exhausted:
            self.seconds += elapsed
            self._at, self._reason = now, decision.budget_reason

    def recent_reason(self, now: float) -> str | None:
        """Why the budget stood in a target's way within the window; None: it did not."""
        if self._at is not None and now - self._at < RECENT_SAMPLES:
            return self._reason
        return None


# The kernel's pause (a containers' CPU limit that is not ours) counts as past the budget
# only beyond it by this much: its reading from the throttled-period counters is coarse.
KERNEL_PAUSE_SLACK = 0.01


def budget_reason(cpu_capped: bool, gpu_capped: bool, kernel_pause: float,
                  max_pause_fraction: float, limit_wanted: float | None) -> str | None:
    """Why the slowdown budget stands in a target's way, or None: a controller's actuators
    were held back by the budget while over its target (`cpu_capped`, `gpu_capped`: the
    CPU and GPU controllers' own verdicts), the budget needs a limit over the target
    (`limit_wanted`; it may have been lifted already), or the containers' CPU limit holds
    the workload back past the budget: the target is out of reach within maxSlowdown."""
    if cpu_capped:
        return "held back as far as maxSlowdown allows, the CPU is still over its target"
    if gpu_capped:
        return "held back as far as maxSlowdown allows, the GPU is still over its target"
    if limit_wanted is not None:
        return (f"maxSlowdown needs the containers' CPU limit at {limit_wanted:.2f} cores, "
                "over the target")
    if kernel_pause > max_pause_fraction + KERNEL_PAUSE_SLACK:
        return (f"the containers' CPU limit holds the workload back {kernel_pause:.0%} of "
                f"the time, more than maxSlowdown allows ({max_pause_fraction:.0%})")
    return None


def cpu_controller(policy: Policy, plan: Plan | None = None) -> CpuController | None:
    """The CPU controller for a policy held by `plan` (None: as written). Its margin
    under the target keeps the 1-second peaks of pacing and signals under it; a kernel
    quota of ours holds every period to the rate itself, so there it aims at the target
    (the margin cost 2% against a plain limit at high targets, and bought nothing)."""
    if not policy.cpu_peak_cores:
        return None
    margin = 0.0 if (plan or plan_as_written(policy)).kernel_quota else DEFAULT_MARGIN
    return CpuController(policy.cpu_peak_cores, policy.adaptive, margin=margin)


def observation(sample: Sample, pacing_by_peers: bool, gpu_bound: bool) -> CpuObservation:
    """The CPU controller's view of an interval. `pacing_by_peers`: the runtime paced
    two or more processes in it; `gpu_bound`: the GPU's rate held the workload back in
    it (the CPU controller must not read that pause as its own: it would wind up)."""
    obs = CpuObservation(
        usage_cores=sample.usage_cores,
        pause_fraction=sample.pause_fraction,
        pause_capped=sample.cooperative_capped or sample.enforcer_capped,
        # Only peers given equal shares they use unequally can leave usage under the
        # rate by the actuator's own bias; one paced process or the enforcer gets
        # exactly its rate, so a shortfall while pacing is a partly idle interval.
        may_under_deliver=pacing_by_peers,
    )
    return replace(obs, pause_fraction=0.0, pause_capped=False) if gpu_bound else obs


def decide(sample: Sample, controller: CpuController | None, pacing_by_peers: bool,
           was_gpu_bound: bool, gpu_duty: float | None, gpu_exhausted: bool,
           max_pause_fraction: float = 1.0, limit_wanted: float | None = None,
           actuator_changes: bool = False) -> Decision:
    """The rate for the next interval: the CPU controller's, or the GPU duty's as a CPU
    rate where that is lower (gpu_rate); and the budget's verdict (budget_reason:
    `max_pause_fraction` is the budget's pause, `limit_wanted` the containers' limit the
    budget needs, in a pod). `actuator_changes`: the next interval is held by another
    actuator (the enforcer's stop instead of pacing, or back), so the CPU controller
    starts again from its target: its trim corrected the last actuator's bias, not the
    next one's."""
    obs = observation(sample, pacing_by_peers, was_gpu_bound)
    cpu = controller.update(obs) if controller else None
    rate = cpu.rate_cores if cpu else None
    gpu = gpu_rate(sample, gpu_duty)
    gpu_bound = gpu is not None and (rate is None or gpu < rate)
    if actuator_changes and controller and not gpu_bound:
        rate = controller.restart()
    return Decision(
        rate_cores=gpu if gpu_bound else rate,
        gpu_bound=gpu_bound,
        throttling=(bool(cpu and cpu.throttling) or bool(gpu_duty)
                    or sample.kernel_pause > BINDING_PAUSE_FRACTION),
        budget_reason=budget_reason(bool(cpu and cpu.budget_exhausted), gpu_exhausted,
                                    sample.kernel_pause, max_pause_fraction, limit_wanted),
        limit_wanted_cores=limit_wanted,
    )


def gpu_rate(sample: Sample, duty: float | None) -> float | None:
    """The GPU duty as a CPU rate: the workload's unthrottled CPU rate x (1 - duty).

    Holding the feeding processes back is what idles the GPU, and the CPU token buckets
    (runtime pacing, signal enforcer) are the actuators that already hold them back.
    """
    if not duty:
        return None
    demand = sample.usage_cores / max(0.05, 1.0 - sample.pause_fraction)
    return max(0.01, demand * (1.0 - duty))
