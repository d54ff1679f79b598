"""`throttledjob sidecar`: the agent inside a ThrottledJob pod.

The workload is every process of the pod's shared process namespace but the sidecar's
own and pid 1 ('pause'); `--root-pid` narrows it to one process tree (tests, or a pod
without a shared namespace where the workload is known by other means). The policy is
a projected ConfigMap, reloaded live. Whatever the exit, nothing is left stopped: on
start it resumes a workload a dead predecessor left stopped, on exit it resumes all, and
if it dies inside a stop the pod's guard (cpu/guard.py) resumes the workload when the stop's
lease ends. GET /prestop (the workload containers' preStop hook) stands it down for good.
"""

from __future__ import annotations

import logging
import math
import signal
import threading

from throttledjob.contracts.policy import Policy

from ..logs import log_to_stderr
from .agent import Agent
from .cpu.cgroups.container_quota import ContainerQuota
from .cpu.cgroups.fs import cgroup_of, pod_cgroup
from .cpu.enforcement import pod_enforcer, pod_plan
from .cpu.processes import ProcessTree, resume
from .exporter import Exporter
from .gpu_agent import open_gpu_agent
from .loop import run_loop
from .policy_watch import PolicyWatcher
from .record import CycleResult

log = logging.getLogger("throttledjob.sidecar")


def run_sidecar(policy_path: str, shared_dir: str, host: str = "0.0.0.0", port: int = 9400,
                gpu_backend: str = "auto", gpu_power_limit: bool = False,
                root_pid: int | None = None, stop: threading.Event | None = None) -> int:
    log_to_stderr()
    stop = stop or threading.Event()
    # --gpu-power-limit allows the lever whatever the ConfigMap says, as run's flags do.
    watcher = PolicyWatcher(policy_path, overrides={"gpu_power_limit": "allow"}
                            if gpu_power_limit else {})
    written = watcher.poll() or Policy().with_overrides(**watcher.overrides)
    if watcher.error:  # no valid policy yet: measure and export, throttle nothing
        log.warning("throttledjob: policy: %s", watcher.error)
    scope = None if root_pid is not None else pod_cgroup(cgroup_of("self"))
    tree = ProcessTree(root_pid=root_pid, pod_cgroup=scope)
    if not tree.scoped:
        log.warning("throttledjob: cannot tell this pod's processes from others (no pod "
                    "cgroup in /proc/self/cgroup): measuring every process in the "
                    "namespace, signalling none")
    resume(tree.pids())  # a predecessor killed mid-pause leaves the workload stopped
    # In a pod the kernel's quota is the workload's CPU limit, which the operator set
    # from the target (or not, and then the policy says Both): read live once the
    # workload's cgroups are there (sidecar/cpu/enforcement.py says what holds the target).
    limit = None
    plan = pod_plan(written, limit, scoped=tree.scoped)
    log.info("throttledjob: the CPU target is held by %s", plan.reason)
    gpu = open_gpu_agent(gpu_backend, written)
    log.info("throttledjob: %s", gpu.note)
    # The containers' own limits, read live through the workload's processes (a pod only).
    kernel = ContainerQuota(tree) if tree.scoped else None
    agent = Agent(written, tree, shared_dir, pod_enforcer(plan, tree, shared_dir), gpu=gpu,
                  container_quota=kernel, plan=plan)
    exporter = Exporter(host, port).attach(agent, _cpu_telemetry(tree, root_pid))
    exporter.server.on_prestop = lambda: _stand_down(agent)
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        exporter.start()
        log.info("throttledjob: sidecar serving http://%s:%d/metrics", host, exporter.port)
        agent.start()
        run_loop(agent, PodHost(agent, tree, watcher, exporter, stop, root_pid, written,
                                limit))
    finally:
        agent.close()  # resumes what the enforcer stopped, restores GPU power limits
        resume(tree.pids())
        exporter.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


class PodHost:
    """The pod around the loop: the policy's ConfigMap and the containers' CPU limit,
    both live; problems and telemetry reported through the exporter."""

    def __init__(self, agent: Agent, tree: ProcessTree, watcher: PolicyWatcher,
                 exporter: Exporter, stop: threading.Event, root_pid: int | None,
                 written: Policy, limit: float | None) -> None:
        self.agent, self.tree, self.watcher, self.exporter = agent, tree, watcher, exporter
        self.stop, self.root_pid = stop, root_pid
        self.written, self.limit = written, limit

    def wait(self, timeout: float) -> bool:
        return self.stop.wait(timeout)

    def before_cycle(self) -> None:
        agent, exporter, watcher = self.agent, self.exporter, self.watcher
        new = watcher.poll()
        live = _live_limit(agent, self.limit)
        if new is not None or live != self.limit:
            self.written, self.limit = new or self.written, live
            self._replan()
            exporter.set_interval(agent.policy.interval_seconds)
            log.info("throttledjob: policy %s; the CPU target is held by %s",
                     "reloaded from " + watcher.path if new
                     else f"under the workload's CPU limit, now {self.limit} cores",
                     agent.plan.reason)
        exporter.set_policy_reloads(watcher.reloads)
        exporter.report("policy", watcher.error)
        exporter.report("processes", None if self.tree.pids() else
                        "no workload process visible: is shareProcessNamespace on?")
        exporter.set_cpu_telemetry(_cpu_telemetry(self.tree, self.root_pid))

    def after_cycle(self, result: CycleResult) -> None:
        self.exporter.report("signals", self.agent.enforcer_error)

    def cycle_failed(self, error: Exception, in_a_row: int) -> None:
        self.exporter.report("processes", f"control cycle failed: {error!r}")
        if in_a_row == 1:
            log.error("throttledjob: control cycle failed; workload released",
                      exc_info=error)

    def _replan(self) -> None:
        agent = self.agent
        if agent.stood_down:
            return
        plan = pod_plan(self.written, self.limit, agent.last.cpu_limit_wanted_cores,
                        self.tree.scoped)
        if plan.enforcer and not agent.has_enforcer:  # a live edit turned signals on
            agent.use_enforcer(pod_enforcer(plan, self.tree, agent.settings_dir))
        agent.set_policy(self.written, plan)


def _live_limit(agent: Agent, last: float | None) -> float | None:
    """The workload containers' CPU limit now (an in-place resize changes it), as their
    cgroups say (math.inf: one has none); the last one known where they cannot be read."""
    kernel = agent.container_quota
    if kernel is None or not kernel.visible:
        return last
    limit = kernel.limit_cores()
    return math.inf if limit is None else limit


def _stand_down(agent: Agent) -> None:
    log.info("throttledjob: the pod is terminating (preStop): throttling ends")
    agent.stand_down()


def _cpu_telemetry(tree: ProcessTree, root_pid: int | None) -> str:
    n = len(tree.pids())
    if root_pid is not None:
        return f"psutil: process tree of pid {root_pid} ({n} processes)"
    if n == 0:
        return ("psutil: no workload process visible (no shared process namespace?); "
                "progress files only")
    return f"psutil: shared process namespace ({n} processes)"
