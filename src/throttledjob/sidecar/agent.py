"""One control cycle, shared by local mode and the pod sidecar: measure, decide, actuate.

Each cycle reads the tree's CPU time and the runtime's progress records, asks the
controller for a quota, writes the settings file for cooperating processes and arms
the enforcer for those that do not cooperate. It returns a frozen `CycleResult` (also
handed to every observer): the only view of the agent that readers (the /status
snapshot, the `--report`, the status line) get, so none reaches into the agent.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from throttledjob.contracts.policy import Enforcement, Policy
from throttledjob.contracts.progress import MAX_PROGRESS_FILES
from throttledjob.contracts.settings import SETTINGS_FILE, Settings
from throttledjob.runtime.files import write_json_atomic
from throttledjob.runtime.progress import read_progress

from .cgroups.container_quota import ContainerQuota
from .cgroups.throttling import ThrottleStats
from .controller import BINDING_PAUSE_FRACTION, DEFAULT_MARGIN, CpuController, CpuObservation
from .enforcer import Enforcer
from .explorer import DEFAULT_LEVERS, Explorer, Levers, LeverSample, Pacing, probe_order
from .os_levers import OsLevers
from .processes import ProcessTree, alive, resume
from .stats import RECENT_SAMPLES, PeakSummary, PeakTracker

if TYPE_CHECKING:
    from .gpu import GpuAgent, GpuState

# With enforcement Both, the workload counts as cooperating while it has called step()
# within this many control intervals; otherwise the signal enforcer takes over.
COOPERATION_TIMEOUT_INTERVALS = 3


# Processes whose steps are counted over a run (the sidecar keeps each one's last count):
# bounded, whatever the shared directory holds.
MAX_STEP_PIDS = 4 * MAX_PROGRESS_FILES


@dataclass(frozen=True)
class CycleStatus:
    """What the last cycle saw and did (for the status line, metrics and /status)."""

    usage_cores: float = 0.0
    quota_cores: float | None = None
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
    status: CycleStatus
    cycle_seconds: float            # how long the cycle itself took
    cpu_seconds: float              # the workload's CPU time so far
    processes: int                  # processes counted as the workload
    cpu: PeakSummary                # of 1-second CPU samples, in cores
    signal_paused_seconds: float    # time the enforcer held the workload back
    cooperative_paused_seconds: float  # time the runtime paced itself
    budget_exhausted_seconds: float
    levers: Levers                  # the cooperative levers in force (settings.json)
    controller_quota: float | None  # the CPU controller's quota (None: no CPU target)
    kernel_throttling: ThrottleStats | None  # cpu.stat of the kernel quota, where one holds
    gpu: GpuState | None
    # Time the levers in force cost by themselves (fewer threads, smaller batches: slower
    # steps no pause shows), from the explorer's measured unthrottled rate.
    lever_cost_seconds: float = 0.0
    # Time a kernel quota that is not ours held the workload back (in a pod: the
    # containers' CPU limits, seen through ContainerQuota).
    kernel_paused_seconds: float = 0.0
    # The budget stood in a target's way within the window over which the target is
    # judged (stats.RECENT_SAMPLES seconds): a target missed in that window is missed
    # because of the budget, even where the last interval alone no longer shows it.
    budget_exhausted_recently: bool = False


def cpu_controller(policy: Policy) -> CpuController | None:
    """The CPU controller for a policy. Its margin under the target keeps the 1-second
    peaks of pacing and signals under it; the kernel's quota holds every period to the
    quota itself, so there it aims at the target (the margin cost 2% against a plain
    limit at high targets, and bought nothing)."""
    if not policy.cpu_peak_cores:
        return None
    margin = 0.0 if policy.enforced_by_the_kernel else DEFAULT_MARGIN
    return CpuController(policy.cpu_peak_cores, policy.adaptive, margin=margin)


class Agent:
    def __init__(self, policy: Policy, tree: ProcessTree, settings_dir: str,
                 enforcer: Enforcer | None = None, clock: Callable[[], float] = time.monotonic,
                 gpu: GpuAgent | None = None,
                 container_quota: ContainerQuota | None = None) -> None:
        self.policy = policy
        self.gpu = gpu
        # Called with each cycle's result (the metrics exporter publishes a snapshot).
        self.observers: list[Callable[[CycleResult], None]] = []
        self._gpu_bound = False
        self.tree = tree
        self.settings_dir = settings_dir
        self._enforcer = enforcer
        # The kernel quota of the workload's containers, read only: it is reported (the
        # time it held the workload back, its counters), never fed to the controller,
        # whose quota paces the steps; a limit it cannot move would wind it down.
        self.container_quota = container_quota
        self._last_kernel_paused = 0.0
        self._running = False
        self.clock = clock
        self.controller = cpu_controller(policy)
        # Cheaper cooperative levers than the quota, found online (sidecar/explorer.py);
        # made at the first reported step, when the levers the workload uses are known.
        self.explorer: Explorer | None = None
        self._explorer_steps: int | None = None
        self.os_levers = OsLevers(policy.nice, policy.cpu_affinity)
        self._cpu_peaks = PeakTracker()
        self.status = CycleStatus()
        self.seq = 0
        self.started = clock()
        self._cooperative_paused_seconds = 0.0
        self._budget_exhausted_seconds = 0.0
        self._budget_exhausted_at: float | None = None  # the last such interval's end
        self._lever_cost_seconds = 0.0
        self._last_cpu = tree.cpu_seconds()
        self._last_time = self.started
        self._last_coop_paused: dict[int, float] = {}
        self._last_step_time = -1e18
        self._last_signal_paused = 0.0
        self._steps_by_pid: dict[int, int] = {}
        # Pacing was by stop in the last cycle: signals stay armed for one interval more
        # when the explorer hands pacing back to the runtime, which picks the quota up
        # only at its next settings check.
        self._stop_pacing = False
        # The runtime was given the quota in the last cycle (read by the next observation).
        self._coop_pacing = False
        # What the last actuation left: the settings file's error, whether signals hold.
        self._settings_error: str | None = None
        self._enforcer_armed = False
        self.result = self._result(self.started, 0.0)
        # Held by a control cycle and by stand_down, which comes from the HTTP thread.
        self.lock = threading.Lock()
        self.stood_down = False

    def start(self) -> None:
        """Arm the actuators before the workload runs its first instruction."""
        self.os_levers.apply(self.tree.pids())
        if self.container_quota:  # what ran before us is not ours to count
            self.container_quota.refresh()
        quota = self.controller.quota if self.controller else None
        self._actuate(quota, now=self.started)
        self.status = replace(self.status, error=self._settings_error,
                              enforcer_armed=self._enforcer_armed)
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
        without a quota published before this returns; later policy edits are ignored.
        The kernel's quota (a CPU limit in the pod spec) is not ours to lift."""
        with self.lock:
            self.set_policy(Policy(interval_seconds=self.policy.interval_seconds))
            self.stood_down = True
            self.os_levers.restore()
            self.release()
            self._actuate(None, self.clock())

    def cycle(self) -> CycleResult:
        with self.lock:
            return self._cycle()

    def _cycle(self) -> CycleResult:
        began = time.perf_counter()
        now = self.clock()
        self.tree.refresh()
        self.os_levers.apply(self.tree.pids())
        cpu = self.tree.cpu_seconds()
        elapsed = max(1e-6, now - self._last_time)
        used = max(0.0, cpu - self._last_cpu)
        self._last_cpu, self._last_time = cpu, now
        self._cpu_peaks.add(used, elapsed)  # peaks are over 1-second samples

        everyone = read_progress(self.settings_dir)
        for r in everyone:  # the count survives the process that made it
            if r.pid in self._steps_by_pid or len(self._steps_by_pid) < MAX_STEP_PIDS:
                self._steps_by_pid[r.pid] = max(r.steps, self._steps_by_pid.get(r.pid, 0))
        records = [r for r in everyone if alive(r.pid)]
        cooperating = [r.pid for r in records]
        coop_pause, coop_capped = self._cooperative_pause(records, elapsed)
        signal_paused = self._signal_paused_seconds
        sig_pause = (signal_paused - self._last_signal_paused) / elapsed
        self._last_signal_paused = signal_paused
        steps = sum(self._steps_by_pid.values())
        if steps != self.status.steps:
            self._last_step_time = now
        kernel_pause = self._container_quota_pause(elapsed)

        obs = CpuObservation(
            usage_cores=used / elapsed,
            pause_fraction=min(1.0, max(coop_pause, sig_pause)),
            pause_capped=coop_capped or bool(self._enforcer and self._enforcer.pause_capped),
            # Only peers given equal shares they use unequally can leave usage under the
            # quota by the actuator's own bias; one paced process or the enforcer gets
            # exactly its quota, so a shortfall while pacing is a partly idle interval.
            may_under_deliver=self._coop_pacing and len(cooperating) >= 2,
        )
        gpu_duty = self.gpu.cycle(elapsed, obs.pause_fraction,
                                  sorted({d for r in records for d in r.visible_devices}),
                                  steps - self.status.steps) if self.gpu else None
        # While the GPU quota is the one holding the workload back, the CPU controller must
        # not read that pause as its own (it would wind its quota up meanwhile).
        cpu_obs = replace(obs, pause_fraction=0.0, pause_capped=False) \
            if self._gpu_bound else obs
        decision = self.controller.update(cpu_obs) if self.controller else None
        quota = decision.quota_cores if decision else None
        gpu_quota = _gpu_quota(obs, gpu_duty)
        self._gpu_bound = gpu_quota is not None and (quota is None or gpu_quota < quota)
        if self._gpu_bound:
            quota = gpu_quota
        gpu_exhausted = bool(self.gpu and self.gpu.decision and self.gpu.decision.budget_exhausted)
        if (decision and decision.budget_exhausted) or gpu_exhausted:
            self._budget_exhausted_seconds += elapsed
        # The interval ran under the levers chosen before it: charge what they cost.
        cost = self._lever_slowdown()
        self._lever_cost_seconds += (1 - obs.pause_fraction) * elapsed * (1 - 1 / cost)
        self._explore(obs, steps, elapsed, records)
        quota = self._actuate(quota, now)
        # The containers' limit holds the workload back past the budget, or the budget
        # needs a limit over the target (it may have been lifted already): either way the
        # target is out of reach within maxSlowdown.
        wanted = self._wanted_limit()
        kernel_over_budget = (kernel_pause > self.policy.max_pause_fraction + 0.01
                              or wanted is not None)
        if kernel_over_budget and not (decision and decision.budget_exhausted):
            self._budget_exhausted_seconds += elapsed
        exhausted = (bool(decision and decision.budget_exhausted) or gpu_exhausted
                     or kernel_over_budget)
        if exhausted:
            self._budget_exhausted_at = now
        self.status = CycleStatus(
            usage_cores=obs.usage_cores,
            quota_cores=quota,
            pause_fraction=max(obs.pause_fraction, kernel_pause),
            throttling=(bool(decision and decision.throttling) or bool(gpu_duty)
                        or kernel_pause > BINDING_PAUSE_FRACTION),
            budget_exhausted=exhausted,
            cooperating_pids=cooperating,
            steps=steps,
            enforcer_armed=self._enforcer_armed,
            error=self._settings_error,
            gpu_duty=gpu_duty,
            cpu_limit_wanted_cores=wanted,
            cpu_demand_cores=(self.container_quota.demand_by_container()
                              if self.container_quota else {}),
        )
        self.result = self._result(now, time.perf_counter() - began)
        for observer in self.observers:
            observer(self.result)
        return self.result

    def _result(self, now: float, cycle_seconds: float) -> CycleResult:
        return CycleResult(
            time=now, wall_seconds=now - self.started, policy=self.policy, status=self.status,
            cycle_seconds=cycle_seconds, cpu_seconds=self._last_cpu,
            processes=len(self.tree.pids()), cpu=self._cpu_peaks.summary(),
            signal_paused_seconds=self._signal_paused_seconds,
            cooperative_paused_seconds=self._cooperative_paused_seconds,
            budget_exhausted_seconds=self._budget_exhausted_seconds, levers=self.levers,
            controller_quota=self.controller.quota if self.controller else None,
            kernel_throttling=self._kernel_throttling(),
            gpu=self.gpu.state() if self.gpu else None,
            lever_cost_seconds=self._lever_cost_seconds,
            kernel_paused_seconds=self._last_kernel_paused,
            budget_exhausted_recently=(self._budget_exhausted_at is not None
                                       and now - self._budget_exhausted_at < RECENT_SAMPLES),
        )

    def _container_quota_pause(self, elapsed: float) -> float:
        """The share of the last interval the containers' kernel quota held the workload
        back (0 without one)."""
        if self.container_quota is None:
            return 0.0
        self.container_quota.refresh()
        paused = self.container_quota.paused_seconds
        pause, self._last_kernel_paused = (paused - self._last_kernel_paused) / elapsed, paused
        return min(1.0, max(0.0, pause))

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

    @property
    def _signal_paused_seconds(self) -> float:
        return self._enforcer.paused_seconds if self._enforcer else 0.0

    def set_policy(self, policy: Policy) -> None:
        """Apply an edited policy (a live ConfigMap change) from the next cycle on; none
        once the agent stood down."""
        if self.stood_down:
            return
        old = self.policy
        self.policy = policy
        if self._explorable(old) != self._explorable(policy):
            self.explorer, self._explorer_steps = None, None
        elif self.explorer and policy.cpu_peak_cores != old.cpu_peak_cores:
            self.explorer.set_target(policy.cpu_peak_cores)
        if self.explorer:
            self.explorer.max_slowdown = policy.max_slowdown
        if (policy.cpu_peak_cores, policy.mode, policy.enforced_by_the_kernel) != (
                old.cpu_peak_cores, old.mode, old.enforced_by_the_kernel):
            self.controller = cpu_controller(policy)
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

    def _cooperative_pause(self, records, elapsed: float) -> tuple[float, bool]:
        deltas = []
        for r in records:
            before = self._last_coop_paused.get(r.pid, r.paused_seconds)
            deltas.append(max(0.0, r.paused_seconds - before))
        self._last_coop_paused = {r.pid: r.paused_seconds for r in records}
        self._cooperative_paused_seconds += max(deltas, default=0.0)
        pause = max(deltas, default=0.0) / elapsed
        return pause, any(r.pause_capped for r in records)

    def _actuate(self, quota: float | None, now: float) -> float | None:
        """Publish the settings and arm the enforcer; returns the quota in force."""
        p = self.policy
        stop_pacing = p.enforcement is Enforcement.BOTH and self.levers.pacing == Pacing.STOP
        if stop_pacing != self._stop_pacing and self.controller and not self._gpu_bound:
            quota = self.controller.restart()
        handing_over, self._stop_pacing = self._stop_pacing, stop_pacing
        use_coop = p.uses_pacing and not stop_pacing
        # The kernel's quota and signals-only hold the tree always; in BOTH, the enforcer
        # holds it while the workload does not pace itself.
        use_signals = p.enforcement in (Enforcement.SIGNALS, Enforcement.QUOTA) or (
            p.enforcement is Enforcement.BOTH
            and (stop_pacing or handing_over
                 or now - self._last_step_time > COOPERATION_TIMEOUT_INTERVALS
                 * p.interval_seconds))
        self._coop_pacing = use_coop
        self.seq += 1
        max_pause = self._max_pause_fraction()
        settings = Settings(
            seq=self.seq, time=time.time(),
            # Published even while signals hold the tree: a process that starts calling
            # step() paces from its first call, with no unthrottled hand-over gap.
            cpu_quota_cores=quota if use_coop else None,
            max_pause_fraction=max_pause,
            threads=self.levers.threads, batch_scale=self.levers.batch_scale,
            rate_limit_per_second=p.rate_limit_per_second,
            gpu_memory_fraction=p.gpu_memory_fraction, params=p.params,
            stale_after_seconds=max(10.0, 5 * p.interval_seconds),
        )
        self._settings_error = None
        try:
            write_json_atomic(os.path.join(self.settings_dir, SETTINGS_FILE), settings.to_dict())
        except OSError as e:
            self._settings_error = f"cannot write settings: {e.strerror or e}"
        if self._enforcer:
            self._enforcer.set(quota if use_signals else None, max_pause)
            self._enforcer_armed = bool(quota and use_signals)
        return quota

    def _lever_slowdown(self) -> float:
        """What the levers in force cost by themselves (1: nothing, or not known)."""
        return (self.explorer.lever_slowdown() if self.explorer else None) or 1.0

    def _max_pause_fraction(self) -> float:
        """The pause the slowdown budget leaves once the levers in force are charged: a
        lever that costs c by itself leaves maxSlowdown / c for the duty cycle."""
        # With no cost (1) this is the policy's own 1 - 1/maxSlowdown.
        return max(0.0, 1.0 - self._lever_slowdown() / self.policy.max_slowdown)

    @property
    def levers(self) -> Levers:
        """The cooperative levers in force: the explorer's choice, else the policy's."""
        if self.explorer is not None:
            return self.explorer.levers
        return Levers(self.policy.threads, self.policy.batch_scale)

    @staticmethod
    def _explorable(p: Policy) -> bool:
        """Levers are explored only where the runtime applies them and the user left
        them free: adaptive mode, a CPU target, not signals alone, no static levers."""
        return bool(p.cpu_peak_cores and p.adaptive and p.enforcement is not Enforcement.SIGNALS
                    and p.threads is None and p.batch_scale == 1.0)

    def _explore(self, obs: CpuObservation, steps: int, elapsed: float, records) -> None:
        if not self._explorable(self.policy):
            return
        done = 0 if self._explorer_steps is None else max(0, steps - self._explorer_steps)
        self._explorer_steps = steps
        if self.explorer is None:
            if not done:
                return  # no step reported (yet): the policy's levers, as without explorer
            stop = self._enforcer is not None and self.policy.enforcement is Enforcement.BOTH
            candidates = probe_order(_usable_cores(), self.policy.cpu_peak_cores, stop)
            if any(r.batch_size is not None for r in records):  # it uses tj.batch_size()
                candidates += [Levers(batch_scale=0.5)]
            if not candidates:
                return
            self.explorer = Explorer(self.policy.cpu_peak_cores, candidates,
                                     max_slowdown=self.policy.max_slowdown)
        self.explorer.update(LeverSample(obs.usage_cores, obs.pause_fraction, done, elapsed))

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
            "estimates": {str(e.levers): {"steps_per_cpu_second": round(e.efficiency, 3),
                                          "peak_cores": round(e.peak_cores, 3),
                                          "samples": e.samples, "aborted": e.aborted}
                          for e in ex.estimates.values()},
            "chose_non_default": decision.levers != DEFAULT_LEVERS,
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


def _gpu_quota(obs: CpuObservation, duty: float | None) -> float | None:
    """The GPU duty as a CPU quota: the workload's unthrottled CPU rate x (1 - duty).

    Holding the feeding processes back is what idles the GPU, and the CPU token buckets
    (runtime pacing, signal enforcer) are the actuators that already hold them back.
    """
    if not duty:
        return None
    demand = obs.usage_cores / max(0.05, 1.0 - obs.pause_fraction)
    return max(0.01, demand * (1.0 - duty))
