"""How the CPU target is held: one plan, from the written policy and what the host allows.

Every other part reads the `Plan` made here (the agent, the summary, the report, the
hosts); none re-reads `Policy.enforcement`. The ladder:

- **Quota, local mode**: the kernel's CFS quota on the command's own cgroup, where this
  machine lets us set one (cgroups/detection.py); else signals and pacing (Both), saying why.
- **Quota, in a pod**: the workload containers' CPU limit is the kernel's quota; the
  operator set it from the target when it built the Job. Whether it could is the
  operator's decision, written in the pod's policy (operator/quota.py: Both where it
  could not); the sidecar reads it and infers nothing. It paces the steps the workload
  reports on top (Cooperative). Where the live limit, read from the containers' cgroups,
  is none or over the target (a live edit lowered the target and the resize was
  refused), signals and pacing hold the rest (Both). A limit the slowdown budget lifted,
  as the sidecar asked, holds the target as far as the budget allows: no signals are
  added to it.
- **Cooperative**: pacing at the steps the workload reports. **Signals**: SIGSTOP and
  SIGCONT, for any program. **Both**: pacing while the workload calls step(), signals
  while it does not.
- Signals stop only processes known to be the workload's (in a pod: those of the pod's
  cgroup); where they cannot be told apart from others, none are sent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from throttledjob.contracts.policy import Enforcement, Policy

from .cgroups.detection import Detection
from .cgroups.local_quota import CgroupQuota
from .enforcer import Enforcer, SignalEnforcer
from .lease import lease_path
from .processes import ProcessTree

# The operator writes a lifted limit in whole millicores: a limit this close over the
# lift the sidecar asked for is that lift.
LIFT_SLACK_CORES = 0.01


@dataclass(frozen=True)
class Plan:
    """How the CPU target is held now."""

    enforcement: Enforcement  # the way in force: the written one, or its fallback
    # What holds the workload without its cooperation: "quota" (a kernel quota this
    # process sets, local mode), "signals", or None (nothing: pacing, or no target).
    enforcer: str | None
    reason: str  # which and why, in one line (logs, --report)

    @property
    def pacing(self) -> bool:
        """The runtime library paces the steps the workload reports."""
        return self.enforcement in (Enforcement.COOPERATIVE, Enforcement.BOTH)

    @property
    def enforcer_always(self) -> bool:
        """The enforcer holds the workload every interval (in Both, only while the
        workload does not pace itself)."""
        return self.enforcement in (Enforcement.SIGNALS, Enforcement.QUOTA)

    @property
    def kernel_quota(self) -> bool:
        """A kernel quota of ours holds the target: every period (the container's, or
        local mode's 50 ms) at the quota, so the controller aims at the target itself and
        its time held back counts as the quota lever's."""
        return self.enforcement is Enforcement.QUOTA


_NAMES = {Enforcement.SIGNALS: "signals", Enforcement.BOTH: "signals and pacing",
          Enforcement.COOPERATIVE: "pacing"}


def plan_as_written(policy: Policy) -> Plan:
    """The plan where the host allows whatever the policy asks (tests, benchmarks)."""
    e = policy.enforcement
    enforcer = {Enforcement.QUOTA: "quota", Enforcement.SIGNALS: "signals",
                Enforcement.BOTH: "signals"}.get(e)
    return Plan(e, enforcer, "kernel quota" if e is Enforcement.QUOTA else _NAMES[e])


def without_kernel_quota(why: str) -> Plan:
    """Where no kernel quota holds: signals and pacing (Both), saying why."""
    return Plan(Enforcement.BOTH, "signals", f"signals and pacing ({why})")


def local_plan(policy: Policy, found: Detection | None) -> Plan:
    """Local mode: the kernel's quota on the command's cgroup where `found` (what
    cgroups.detection.detect said, asked only for Quota) has a backend; else signals
    and pacing."""
    if policy.enforcement is not Enforcement.QUOTA:
        return plan_as_written(policy)
    if found is None or found.backend is None:
        return without_kernel_quota(f"no kernel quota: {found.reason if found else 'not asked'}")
    return Plan(Enforcement.QUOTA, "quota", f"kernel quota ({found.backend.describe()})")


def local_enforcer(plan: Plan, tree: ProcessTree, process_group: int,
                   found: Detection | None) -> Enforcer | None:
    """The enforcer of a local plan: the whole process group is the workload's."""
    if plan.enforcer == "quota" and found is not None and found.backend is not None:
        return CgroupQuota(root_pid=process_group, backend=found.backend)
    if plan.enforcer is not None:
        return SignalEnforcer(tree, process_group=process_group)
    return None


def pod_plan(policy: Policy, limit_cores: float | None, lifted_cores: float | None = None,
             scoped: bool = True) -> Plan:
    """In a pod: `limit_cores` is the workload containers' summed CPU limit as their
    cgroups show it (math.inf: some container has none; None: not read yet, as before
    the workload starts: the policy's word stands), `lifted_cores` the limit the sidecar
    asked for to keep the slowdown budget (None: none asked), `scoped` whether the pod's
    processes can be told from others."""
    e, reason = policy.enforcement, ""
    target = policy.cpu_peak_cores
    if e is Enforcement.QUOTA and limit_cores is None and target is not None:
        e, reason = Enforcement.COOPERATIVE, (
            "the containers' CPU limits, set by the operator from the target (the kernel's "
            "quota), and pacing")
    elif e is Enforcement.QUOTA:
        lifted = (limit_cores is not None and lifted_cores is not None
                  and limit_cores <= lifted_cores + LIFT_SLACK_CORES)
        held = limit_cores is not None and target is not None and (
            limit_cores <= target * (1 + 1e-6) or lifted)
        if held:
            e, reason = Enforcement.COOPERATIVE, (
                f"the containers' CPU limit of {limit_cores:g} cores (the kernel's quota)"
                f"{', lifted for the slowdown budget,' if lifted else ''} and pacing")
        else:
            e, reason = Enforcement.BOTH, "signals and pacing ({})".format(
                "no CPU limit on the workload" if limit_cores in (None, math.inf)
                or target is None
                else f"the CPU limit of {limit_cores:g} cores is over the target")
    enforcer = "signals" if e in (Enforcement.SIGNALS, Enforcement.BOTH) else None
    reason = reason or _NAMES[e]
    if enforcer and not scoped:  # never stop a process that may not be the workload's
        enforcer, reason = None, f"{reason}; no signals: the pod's processes are not known"
    return Plan(e, enforcer, reason)


def pod_enforcer(plan: Plan, tree: ProcessTree, shared_dir: str) -> Enforcer | None:
    """The enforcer of a pod plan. Each stop is announced in the shared directory, where
    the guard reads it (guard.py). Scanning the processes 50 times a second costs CPU:
    made only where the plan uses signals."""
    if plan.enforcer != "signals" or not tree.scoped:
        return None
    return SignalEnforcer(tree, lease_path=lease_path(shared_dir))
