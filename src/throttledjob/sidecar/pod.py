"""`throttledjob sidecar`: the agent inside a ThrottledJob pod.

The workload is every process of the pod's shared process namespace but the sidecar's
own and pid 1 ('pause'); `--root-pid` narrows it to one process tree (tests, or a pod
without a shared namespace where the workload is known by other means). The policy is
a projected ConfigMap, reloaded live. Whatever the exit, nothing is left stopped: on
start it resumes a workload a dead predecessor left stopped, on exit it resumes all, and
if it dies inside a stop the pod's guard (guard.py) resumes the workload when the stop's
lease ends. GET /prestop (the workload containers' preStop hook) stands it down for good.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Mapping

from throttledjob.contracts.names import ENV_CPU_LIMIT
from throttledjob.contracts.policy import Policy

from .agent import Agent
from .cgroups.container_quota import ContainerQuota
from .cgroups.fs import cgroup_of, pod_cgroup
from .enforcer import SignalEnforcer
from .exporter import Exporter, log_to_stderr
from .gpu import GpuAgent, open_backend
from .gpu.simulate import follow
from .lease import lease_path
from .policy_watch import PolicyWatcher
from .processes import ProcessTree, resume

log = logging.getLogger("throttledjob.sidecar")


def run_sidecar(policy_path: str, shared_dir: str, host: str = "0.0.0.0", port: int = 9400,
                gpu_backend: str = "auto", gpu_power_limit: bool = False,
                root_pid: int | None = None, stop: threading.Event | None = None) -> int:
    log_to_stderr()
    stop = stop or threading.Event()
    watcher = PolicyWatcher(policy_path)
    # In a pod the kernel's quota is the workload's CPU limit, which the operator set from
    # the target (or not): Quota holds by it, or falls back to signals and pacing.
    limit = cpu_limit_from_env(os.environ)
    written = watcher.poll() or Policy()
    policy = written.under_cpu_limit(limit)
    if limit is not None:
        log.info("throttledjob: the workload's CPU limit of %g cores is the kernel's quota",
                 limit)
    if watcher.error:  # no valid policy yet: measure and export, throttle nothing
        log.warning("throttledjob: policy: %s", watcher.error)
    scope = None if root_pid is not None else pod_cgroup(cgroup_of("self"))
    tree = ProcessTree(root_pid=root_pid, pod_cgroup=scope)
    if not tree.scoped:
        log.warning("throttledjob: cannot tell this pod's processes from others (no pod "
                    "cgroup in /proc/self/cgroup): measuring every process in the "
                    "namespace, signalling none")
    resume(tree.pids())  # a predecessor killed mid-pause leaves the workload stopped
    backend, note = open_backend(gpu_backend)
    log.info("throttledjob: %s", note)
    gpu = GpuAgent(backend, policy, power_limit_lever=gpu_power_limit, note=note)
    follow(gpu)  # simulated GPUs see what the agent does to the workload
    # The containers' own limits, read live through the workload's processes (a pod only).
    kernel = ContainerQuota(tree) if tree.scoped else None
    agent = Agent(policy, tree, shared_dir, _enforcer(tree, policy, shared_dir), gpu=gpu,
                  container_quota=kernel)
    exporter = Exporter(host, port).attach(agent, _cpu_telemetry(tree, root_pid))
    exporter.server.on_prestop = lambda: _stand_down(agent)
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        exporter.start()
        log.info("throttledjob: sidecar serving http://%s:%d/metrics", host, exporter.port)
        agent.start()
        _loop(agent, tree, watcher, exporter, stop, root_pid, written, limit)
    finally:
        agent.close()  # resumes what the enforcer stopped, restores GPU power limits
        resume(tree.pids())
        exporter.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def cpu_limit_from_env(env: Mapping[str, str]) -> float | None:
    """The workload containers' CPU limit the operator set from the target (cores), or
    None: not set, or not a positive number (then signals hold the target)."""
    try:
        limit = float(env.get(ENV_CPU_LIMIT, ""))
    except ValueError:
        return None
    return limit if math.isfinite(limit) and limit > 0 else None


def _loop(agent: Agent, tree: ProcessTree, watcher: PolicyWatcher, exporter: Exporter,
          stop: threading.Event, root_pid: int | None, written: Policy,
          limit: float | None) -> None:
    next_cycle = time.monotonic()
    failures = 0
    while True:
        next_cycle += agent.policy.interval_seconds
        if stop.wait(max(0.0, next_cycle - time.monotonic())):
            return
        new = watcher.poll()
        live = _live_limit(agent, limit)
        if new is not None or live != limit:
            written, limit = new or written, live
            _apply_policy(agent, tree, written.under_cpu_limit(_holding(agent, limit)),
                          agent.settings_dir)
            exporter.set_interval(agent.policy.interval_seconds)
            log.info("throttledjob: policy %s", "reloaded from " + watcher.path if new
                     else f"under the workload's CPU limit, now {limit} cores")
        exporter.set_policy_reloads(watcher.reloads)
        exporter.report("policy", watcher.error)
        exporter.report("processes", None if tree.pids() else
                         "no workload process visible: is shareProcessNamespace on?")
        exporter.set_cpu_telemetry(_cpu_telemetry(tree, root_pid))
        try:
            agent.cycle()
            exporter.report("signals", agent.enforcer_error)
            failures = 0
        except Exception as e:  # a bug must not leave the workload stopped or kill the pod
            failures += 1
            agent.release()
            exporter.report("processes", f"control cycle failed: {e!r}")
            if failures == 1:
                log.exception("throttledjob: control cycle failed; workload released")


def _live_limit(agent: Agent, last: float | None) -> float | None:
    """The workload containers' CPU limit now (an in-place resize changes it), as their
    cgroups say; the last one known where they cannot be read."""
    kernel = agent.container_quota
    return kernel.limit_cores() if kernel is not None and kernel.visible else last


def _holding(agent: Agent, limit: float | None) -> float | None:
    """The limit as the policy sees it: one the slowdown budget lifted (the sidecar's own
    ask) holds the target as far as the budget allows, so it counts as the target's; no
    signals are added to hold the rest."""
    wanted, target = agent.status.cpu_limit_wanted_cores, agent.policy.cpu_peak_cores
    if limit is not None and wanted is not None and target and limit <= wanted + 0.01:
        return min(limit, target)
    return limit


def _apply_policy(agent: Agent, tree: ProcessTree, policy: Policy, shared_dir: str) -> None:
    if agent.stood_down:
        return
    if policy.uses_signals and not agent.has_enforcer:
        agent.use_enforcer(_enforcer(tree, policy, shared_dir))
    agent.set_policy(policy)


def _stand_down(agent: Agent) -> None:
    log.info("throttledjob: the pod is terminating (preStop): throttling ends")
    agent.stand_down()


def _enforcer(tree: ProcessTree, policy: Policy, shared_dir: str) -> SignalEnforcer | None:
    # Scanning every process 50 times a second costs CPU: only when signals may be used.
    if not tree.scoped:  # never stop a process that may not be the workload's
        return None
    # Each stop announced in the shared directory, where the guard reads it.
    return SignalEnforcer(tree, lease_path=lease_path(shared_dir)) \
        if policy.uses_signals else None


def _cpu_telemetry(tree: ProcessTree, root_pid: int | None) -> str:
    n = len(tree.pids())
    if root_pid is not None:
        return f"psutil: process tree of pid {root_pid} ({n} processes)"
    if n == 0:
        return ("psutil: no workload process visible (no shared process namespace?); "
                "progress files only")
    return f"psutil: shared process namespace ({n} processes)"
