"""One control cycle, shared by local mode and the pod sidecar: measure, decide, act.

measure.py turns the interval's counters into a `Sample`; decide.py turns the sample into
the rate the workload is held to; the explorer picks the cooperative levers; act.py
publishes both (the settings file, the enforcer). Each cycle returns a frozen
`CycleResult` (also handed to every observer): the only view of the agent that readers
(the /status snapshot, the `--report`, the status line) get, so none reaches into it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from throttledjob.contracts.policy import Enforcement, Policy

from .act import Acted, Actuator, stop_pacing
from .cgroups.container_quota import ContainerQuota
from .cgroups.throttling import ThrottleStats
from .controller import BINDING_PAUSE_FRACTION
from .decide import cpu_controller, decide
from .enforcement import Plan, plan_as_written
from .enforcer import Enforcer
from .explorer import Explorer
from .lever_time import LeverLedger, busy_seconds
from .levers import DEFAULT_SETTING, LeverSample, LeverSetting, probe_order
from .measure import Meter, ProgressClock, Sample, progress_clock, steps_in_interval
from .os_levers import OsLevers
from .processes import ProcessTree, resume
from .stats import RECENT_SAMPLES, PeakSummary, PeakTracker, round_or_none

# The explorer's measurements run with the target held, off the slowdown budget's books
# (a probe is the product's experiment, not the user's cost), each for at most this many
# control intervals: a measurement stalled by idle intervals is budgeted again.
PROBE_HOLD_INTERVALS = 8

if TYPE_CHECKING:
    from .gpu import GpuAgent, GpuState


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


@dataclass(frozen=True)
class CycleResult:
    """The agent after a cycle: what it saw and did, and the run's totals so far.

    Everything a reader needs to summarise the run (sidecar/summary.py) is here, copied,
    so a reader on another thread never sees a half-updated agent.
    """

    time: float                     # the agent's clock at the cycle (monotonic seconds)
    wall_seconds: float             # since the agent started
    policy: Policy
    plan: Plan                      # how the CPU target is held (sidecar/enforcement.py)
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


class Agent:
    """One control cycle: measure (measure.py) -> decide (decide.py) -> act (act.py),
    then the run's totals. The GPU wing (gpu/agent.py) measures and decides its own
    duty; its rate enters the CPU decision. The lever explorer (explorer.py) picks the
    cooperative levers between decide and act."""

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
        # Cheaper cooperative levers than pacing alone, found online (explorer.py); made
        # at the first reported step, when the levers the workload uses are known.
        self.explorer: Explorer | None = None
        self._explorer_steps: int | None = None
        # The runtime's clocks when it wrote the steps last seen: Unix time, CPU seconds
        # and which processes wrote (progress_clock).
        self._explorer_clock: ProgressClock | None = None
        self.os_levers = OsLevers(policy.nice, policy.cpu_affinity)
        self.started = clock()
        self.meter = Meter(tree, settings_dir, self.started, container_quota)
        self.actuator = Actuator(settings_dir)
        self._acted = Acted(paced=False, enforcer_armed=False, error=None)
        self._gpu_bound = False
        self._last_step_time = -1e18
        self._cpu_peaks = PeakTracker()
        self._budget_exhausted_seconds = 0.0
        self._budget_exhausted_at: float | None = None  # the last such interval's end
        # Busy time under each lever setting, for what the settings cost (lever_time.py).
        self.ledger = LeverLedger(_usable_cores())
        self._probed: LeverSetting | None = None   # the setting being measured
        self._probe_intervals = 0     # intervals in a row it was held for
        self._probe_seconds = 0.0
        self._probe_max_cores: float | None = None
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
        self._cpu_peaks.add(sample.used_seconds, sample.elapsed)  # 1-second samples
        if sample.new_steps:
            self._last_step_time = now
        gpu_duty = self.gpu.cycle(sample.elapsed, sample.pause_fraction, sample.devices,
                                  sample.new_steps) if self.gpu else None
        wanted = self._wanted_limit()
        decision = decide(sample, self.controller,
                          pacing_by_peers=self._acted.paced and len(sample.records) >= 2,
                          was_gpu_bound=self._gpu_bound, gpu_duty=gpu_duty,
                          gpu_exhausted=bool(self.gpu and self.gpu.budget_exhausted),
                          max_pause_fraction=self.policy.max_pause_fraction,
                          limit_wanted=wanted)
        self._gpu_bound = decision.gpu_bound
        # The interval ran under the levers chosen before it.
        levers = self.levers
        self.ledger.add(levers, self._busy_seconds(levers, sample))
        if self._probing():
            self._probe_seconds += sample.elapsed
            self._probe_max_cores = max(self._probe_max_cores or 0.0, sample.usage_cores)
        self._explore(sample)
        measured = self.levers if self.explorer and self.explorer.measuring else None
        if measured is None and self._probed is not None and self.levers != levers:
            # The probes ended on a change of setting: its first interval is held at the
            # target too. The kernel's last width was the probed setting's (2 threads),
            # and the budget's floor read from it lifted one thread's quota to 1.24
            # cores: a second at 1.09 for a 1-core target.
            measured = self.levers
        self._probe_intervals = (0 if measured is None else self._probe_intervals + 1
                                 if measured == self._probed else 1)
        self._probed = measured
        rate = decision.rate_cores
        if (stop_pacing(self.plan, self.levers) != self.actuator.stopping
                and self.controller and not decision.gpu_bound):
            # The trim corrected the last actuator's bias, not the next one's.
            rate = self.controller.restart()
        self._act(rate, now)
        if decision.budget_exhausted:
            self._budget_exhausted_seconds += sample.elapsed
            self._budget_exhausted_at = now
        self.last = LastCycle(
            usage_cores=sample.usage_cores,
            rate_cores=rate,
            pause_fraction=sample.held_back,
            throttling=decision.throttling or sample.kernel_pause > BINDING_PAUSE_FRACTION,
            budget_exhausted=decision.budget_exhausted,
            cooperating_pids=sample.cooperating,
            steps=sample.steps,
            enforcer_armed=self._acted.enforcer_armed,
            error=self._acted.error,
            gpu_duty=gpu_duty,
            cpu_limit_wanted_cores=wanted,
            cpu_demand_cores=(self.container_quota.demand_by_container()
                              if self.container_quota else {}),
        )
        self.result = self._result(now, time.perf_counter() - began)
        for observer in self.observers:
            observer(self.result)
        return self.result

    def _act(self, rate: float | None, now: float) -> None:
        self._acted = self.actuator.act(
            rate, self.policy, self.plan, self.levers,
            None if self._probing() else self._max_pause_fraction(),
            self._enforcer, now - self._last_step_time, now)

    def _probing(self) -> bool:
        """The next interval measures a lever setting: held at the target, unbudgeted."""
        return 0 < self._probe_intervals <= PROBE_HOLD_INTERVALS

    def _result(self, now: float, cycle_seconds: float) -> CycleResult:
        ex = self.explorer
        lost = self.ledger.time(
            lambda levers: ex.lever_slowdown(levers) if ex else None,
            lambda levers: ex.lever_slowdown(levers, most=True) if ex else None)
        return CycleResult(
            time=now, wall_seconds=now - self.started, policy=self.policy, plan=self.plan,
            last=self.last,
            cycle_seconds=cycle_seconds, cpu_seconds=self.meter.cpu_seconds,
            processes=len(self.tree.pids()), cpu=self._cpu_peaks.summary(),
            signal_paused_seconds=self._enforcer.paused_seconds if self._enforcer else 0.0,
            cooperative_paused_seconds=self.meter.cooperative_paused_seconds,
            budget_exhausted_seconds=self._budget_exhausted_seconds, levers=self.levers,
            controller_rate=self.controller.rate if self.controller else None,
            kernel_throttling=self._kernel_throttling(),
            gpu=self.gpu.state() if self.gpu else None,
            lever_cost_seconds=lost.known, lever_cost_unknown_seconds=lost.unknown,
            lever_cost_bound_seconds=lost.bound,
            probe_seconds=self._probe_seconds, probe_max_cores=self._probe_max_cores,
            kernel_paused_seconds=self.meter.kernel_paused_seconds,
            budget_exhausted_recently=(self._budget_exhausted_at is not None
                                       and now - self._budget_exhausted_at < RECENT_SAMPLES),
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
        if self._explorable(old, old_plan) != self._explorable(policy, self.plan):
            self.explorer, self._explorer_steps = None, None
        elif self.explorer and policy.cpu_peak_cores != old.cpu_peak_cores:
            self.explorer.set_target(policy.cpu_peak_cores)
        if self.explorer:
            self.explorer.max_slowdown = policy.max_slowdown
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
        return (self.explorer.lever_slowdown() if self.explorer else None) or 1.0

    def _max_pause_fraction(self) -> float:
        """The pause the slowdown budget leaves once the levers in force are charged: a
        lever that costs c by itself leaves maxSlowdown / c for the duty cycle."""
        # With no cost (1) this is the policy's own 1 - 1/maxSlowdown.
        return max(0.0, 1.0 - self._lever_slowdown() / self.policy.max_slowdown)

    @property
    def levers(self) -> LeverSetting:
        """The cooperative levers in force: the explorer's choice, else the policy's."""
        if self.explorer is not None:
            return self.explorer.levers
        return LeverSetting(self.policy.threads, self.policy.batch_scale)

    @staticmethod
    def _explorable(p: Policy, plan: Plan) -> bool:
        """Levers are explored only where the runtime applies them and the user left
        them free: adaptive mode, a CPU target, not signals alone, no static levers."""
        return bool(p.cpu_peak_cores and p.adaptive and plan.enforcement is not Enforcement.SIGNALS
                    and p.threads is None and p.batch_scale == 1.0)

    def _explore(self, sample: Sample) -> None:
        if not self._explorable(self.policy, self.plan):
            return
        steps = sample.steps
        done = 0 if self._explorer_steps is None else max(0, steps - self._explorer_steps)
        clock = progress_clock(sample.records)
        if done and self._explorer_clock is not None:
            done = steps_in_interval(done, self._explorer_clock, clock, sample.elapsed)
        self._explorer_steps, self._explorer_clock = steps, clock
        if self.explorer is None:
            if not done:
                return  # no step reported (yet): the policy's levers, as without explorer
            stop = self._enforcer is not None and self.plan.enforcement is Enforcement.BOTH
            candidates = probe_order(_usable_cores(), self.policy.cpu_peak_cores, stop)
            if any(r.batch_size is not None for r in sample.records):  # tj.batch_size()
                candidates += [LeverSetting(batch_scale=0.5)]
            if not candidates:
                return
            self.explorer = Explorer(self.policy.cpu_peak_cores, candidates,
                                     max_slowdown=self.policy.max_slowdown)
        self.explorer.update(LeverSample(sample.usage_cores, sample.held_back, done,
                                         sample.elapsed, cores=_usable_cores(),
                                         busy_width=sample.busy_width))

    def _busy_seconds(self, levers: LeverSetting, sample: Sample) -> float:
        known = self.explorer.estimates.get(levers) if self.explorer else None
        return busy_seconds(sample.elapsed, sample.held_back, sample.used_seconds,
                            known.peak_cores if known else None)

    def explorer_report(self) -> dict | None:
        """What the explorer measured and chose (None when it never ran)."""
        ex = self.explorer
        if ex is None:
            return None
        decision = ex.decision()
        return {
            "state": decision.state, "levers": str(decision.levers),
            "predicted_slowdown": decision.predicted_slowdown,
            "explorations": ex.explorations,
            # R0, the defaults' busy-time steps per second unheld, and the most it can be
            # (Explorer.unthrottled_rate_high); None until the defaults were measured.
            "unthrottled_steps_per_second": round_or_none(ex.unthrottled_rate()),
            "unthrottled_steps_per_second_high": round_or_none(ex.unthrottled_rate_high()),
            "estimates": {str(e.levers): {"steps_per_cpu_second": round(e.efficiency, 3),
                                          "peak_cores": round(e.peak_cores, 3),
                                          "samples": e.samples, "aborted": e.aborted}
                          for e in ex.estimates.values()},
            "chose_non_default": decision.levers != DEFAULT_SETTING,
            "history": [f"{state}({levers})" for state, levers in ex.history],
            # levers, cores used, paused fraction, steps per second: the last intervals
            "trace": [[str(levers), round(s.usage_cores, 3), round(s.pause_fraction, 3),
                       round(s.steps / s.elapsed_seconds, 1)] for levers, s in ex.trace],
        }


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
