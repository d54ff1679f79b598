"""One control cycle, shared by local mode and the pod sidecar: measure, decide, act.

cpu/measure.py turns the interval's counters into a `Sample`; the GPU half (gpu_agent.py)
decides its duty; cpu/decide.py turns the sample and that duty into the rate the workload
is held to; the explorer picks the cooperative levers; cpu/act.py publishes both (the
settings file, the enforcer). Each cycle returns a frozen `CycleResult` (record.py, also
handed to every observer): the only view of the agent that readers (the /status
snapshot, the `--report`, the status line) get, so none reaches into it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from throttledjob.contracts.policy import Enforcement, Policy

from .cpu.act import Acted, Actuator, stop_pacing
from .cpu.decide import BudgetBook, cpu_controller, decide
from .cpu.enforcement import Plan, plan_as_written
from .cpu.lever_choice import LeverChoice
from .cpu.measure import Meter
from .cpu.os_levers import OsLevers
from .cpu.processes import resume
from .record import CycleResult, LastCycle

if TYPE_CHECKING:
    from .cpu.cgroups.container_quota import ContainerQuota
    from .cpu.cgroups.throttling import ThrottleStats
    from .cpu.enforcer import Enforcer
    from .cpu.lever_settings import LeverSetting
    from .cpu.processes import ProcessTree
    from .gpu_agent import GpuAgent


class Agent:
    """One control cycle: measure (cpu/measure.py) -> decide (cpu/decide.py) -> act
    (cpu/act.py), then the run's totals. The GPU half (gpu_agent.py) measures and decides
    its own duty; its rate enters the CPU decision. The lever explorer (cpu/explorer.py)
    picks the cooperative levers between decide and act."""

    def __init__(self, policy: Policy, tree: ProcessTree, settings_dir: str,
                 enforcer: Enforcer | None = None, clock: Callable[[], float] = time.monotonic,
                 gpu: GpuAgent | None = None,
                 container_quota: ContainerQuota | None = None,
                 plan: Plan | None = None) -> None:
        self.policy = policy
        self.plan = plan or plan_as_written(policy)
        self.gpu = gpu
        # Called with each cycle's result (the metrics exporter publishes a snapshot).
        self.observers: list[Callable[[CycleResult], None]] = []
        self.tree = tree
        self.settings_dir = settings_dir
        self._enforcer = enforcer
        # The kernel quota of the workload's containers, read only: it is reported (the
        # time it held the workload back, its counters), never fed to the controller,
        # whose rate paces the steps; a limit it cannot move would wind it down.
        self.container_quota = container_quota
        self._running = False
        self.clock = clock
        self.controller = cpu_controller(policy, self.plan)
        # Cheaper cooperative levers than pacing alone, found online (cpu/lever_choice.py).
        self.choice = LeverChoice()
        self.os_levers = OsLevers(policy.nice, policy.cpu_affinity)
        self.started = clock()
        self.meter = Meter(tree, settings_dir, self.started, container_quota)
        self.actuator = Actuator(settings_dir)
        self._acted = Acted(paced=False, enforcer_armed=False, error=None)
        self._gpu_bound = False
        self.budget = BudgetBook()
        self.last = LastCycle()
        self.result = self._result(self.started, 0.0)
        # Held by a control cycle and by stand_down, which comes from the HTTP thread.
        self.lock = threading.Lock()
        self.stood_down = False

    def start(self) -> None:
        """Arm the actuators before the workload runs its first instruction."""
        self.os_levers.apply(self.tree.pids())
        self.meter.baseline()
        self._act(self.controller.rate if self.controller else None, self.started)
        self.last = replace(self.last, error=self._acted.error,
                              enforcer_armed=self._acted.enforcer_armed)
        self.result = self._result(self.started, 0.0)
        if self._enforcer:
            self._enforcer.start()
        self._running = True

    @property
    def enforcer_error(self) -> str | None:
        """Why the enforcer fails open now, or None."""
        return self._enforcer.error if self._enforcer else None

    @property
    def has_enforcer(self) -> bool:
        return self._enforcer is not None

    def use_enforcer(self, enforcer: Enforcer | None) -> None:
        """Add an enforcer (a live policy edit turned signals on); started at once if the
        agent runs, armed by the next cycle. Closes the one it replaces."""
        if enforcer is self._enforcer:
            return
        if self._enforcer:
            self._enforcer.close()
        self._enforcer = enforcer
        if enforcer and self._running:
            enforcer.start()

    def release(self) -> None:
        """Let the workload run free (a cycle failed): disarm the enforcer, which the next
        good cycle re-arms, and resume every process it may have stopped."""
        if self._enforcer:
            self._enforcer.set(None, 0.0)
        resume(self.tree.pids())

    def stand_down(self) -> None:
        """The pod is terminating (the workload's preStop hook asked): throttle nothing
        from now on, so a workload that checkpoints on SIGTERM does so at full speed.
        Every process is resumed, signals disarmed, the OS levers restored and settings
        without a rate published before this returns; later policy edits are ignored.
        The kernel's quota (a CPU limit in the pod spec) is not ours to lift."""
        with self.lock:
            self.set_policy(Policy(interval_seconds=self.policy.interval_seconds))
            self.stood_down = True
            self.os_levers.restore()
            self.release()
            self._act(None, self.clock())

    def cycle(self) -> CycleResult:
        with self.lock:
            return self._cycle()

    def _cycle(self) -> CycleResult:
        began = time.perf_counter()
        now = self.clock()
        sample = self.meter.measure(now, self._enforcer)
        gpu_duty = self.gpu.cycle(sample.elapsed, sample.pause_fraction, sample.devices,
                                  sample.new_steps) if self.gpu else None
        self.choice.observe(sample, self.policy, self.plan, can_stop=self._enforcer is not None
                            and self.plan.enforcement is Enforcement.BOTH)
        # With the levers chosen for the next interval charged to the budget (the lift
        # asked for is for the intervals to come).
        decision = decide(sample, self.controller,
                          pacing_by_peers=self._acted.paced and len(sample.records) >= 2,
                          was_gpu_bound=self._gpu_bound, gpu_duty=gpu_duty,
                          gpu_exhausted=bool(self.gpu and self.gpu.budget_exhausted),
                          max_pause_fraction=self.policy.max_pause_fraction,
                          limit_wanted=self._wanted_limit(),
                          actuator_changes=stop_pacing(self.plan, self.levers)
                          != self.actuator.stopping)
        self._gpu_bound = decision.gpu_bound
        self._act(decision.rate_cores, now)
        self.budget.add(decision, now, sample.elapsed)
        self.last = LastCycle(
            usage_cores=sample.usage_cores,
            rate_cores=decision.rate_cores,
            pause_fraction=sample.held_back,
            throttling=decision.throttling,
            budget_exhausted=decision.budget_exhausted,
            cooperating_pids=sample.cooperating,
            steps=sample.steps,
            enforcer_armed=self._acted.enforcer_armed,
            error=self._acted.error,
            gpu_duty=gpu_duty,
            cpu_limit_wanted_cores=decision.limit_wanted_cores,
            cpu_demand_cores=(self.container_quota.demand_by_container()
                              if self.container_quota else {}),
            pace=sample.pace,
        )
        self.result = self._result(now, time.perf_counter() - began)
        for observer in self.observers:
            observer(self.result)
        return self.result

    def _act(self, rate: float | None, now: float) -> None:
        self._acted = self.actuator.act(
            rate, self.policy, self.plan, self.levers,
            None if self.choice.probing else self._max_pause_fraction(),
            self._enforcer, now - self.meter.last_step_time, now)

    def _result(self, now: float, cycle_seconds: float) -> CycleResult:
        lost = self.choice.lever_time()
        reason = self.budget.recent_reason(now)
        return CycleResult(
            time=now, wall_seconds=now - self.started, policy=self.policy, plan=self.plan,
            last=self.last,
            cycle_seconds=cycle_seconds, cpu_seconds=self.meter.cpu_seconds,
            processes=len(self.tree.pids()), cpu=self.meter.cpu_peaks.summary(),
            signal_paused_seconds=self._enforcer.paused_seconds if self._enforcer else 0.0,
            cooperative_paused_seconds=self.meter.cooperative_paused_seconds,
            budget_exhausted_seconds=self.budget.seconds, levers=self.levers,
            controller_rate=self.controller.rate if self.controller else None,
            kernel_throttling=self._kernel_throttling(),
            gpu=self.gpu.state() if self.gpu else None,
            lever_cost_seconds=lost.known, lever_cost_unknown_seconds=lost.unknown,
            lever_cost_bound_seconds=lost.bound,
            probe_seconds=self.choice.probe_seconds,
            probe_max_cores=self.choice.probe_max_cores,
            kernel_paused_seconds=self.meter.kernel_paused_seconds,
            budget_exhausted_recently=reason is not None,
            budget_reason=reason,
        )

    def _wanted_limit(self) -> float | None:
        """The limit the budget needs (ContainerQuota.wanted_limit), with what the levers
        in force cost charged to it."""
        target = self.policy.cpu_peak_cores
        if self.container_quota is None or not target:
            return None
        return self.container_quota.wanted_limit(target, self._max_pause_fraction())

    def _kernel_throttling(self) -> ThrottleStats | None:
        ours = self._enforcer.kernel_throttling() if self._enforcer else None
        if ours is None and self.container_quota is not None:
            return self.container_quota.kernel_throttling()
        return ours

    def set_policy(self, policy: Policy, plan: Plan | None = None) -> None:
        """Apply an edited policy (a live ConfigMap change) and the plan that holds it
        (None: as written) from the next cycle on; none once the agent stood down."""
        if self.stood_down:
            return
        old, old_plan = self.policy, self.plan
        self.policy, self.plan = policy, plan or plan_as_written(policy)
        self.choice.set_policy(old, old_plan, policy, self.plan)
        if (policy.cpu_peak_cores, policy.mode, self.plan.kernel_quota) != (
                old.cpu_peak_cores, old.mode, old_plan.kernel_quota):
            self.controller = cpu_controller(policy, self.plan)
        if self.gpu:
            self.gpu.set_policy(policy)

    def close(self) -> None:
        """Restore the OS levers, resume what the enforcer stopped, release the GPUs."""
        self._running = False
        self.os_levers.restore()
        if self._enforcer:
            self._enforcer.close()
        if self.gpu:
            self.gpu.close()

    def _lever_slowdown(self) -> float:
        """What the levers in force cost by themselves (1: nothing, or not known)."""
        return self.choice.lever_slowdown() or 1.0

    def _max_pause_fraction(self) -> float:
        """The pause the slowdown budget leaves once the levers in force are charged: a
        lever that costs c by itself leaves maxSlowdown / c for the duty cycle."""
        # With no cost (1) this is the policy's own 1 - 1/maxSlowdown.
        if self.policy.budget_slowdown is None:  # a hard target
            return self.policy.max_pause_fraction
        return max(0.0, 1.0 - self._lever_slowdown() / self.policy.budget_slowdown)

    @property
    def levers(self) -> LeverSetting:
        """The cooperative levers in force: the explorer's choice, else the policy's."""
        return self.choice.levers(self.policy)
