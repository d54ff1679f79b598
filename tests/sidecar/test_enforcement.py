"""How the CPU target is held (sidecar/cpu/enforcement.py): the ladder from the written
policy and what the host allows, in a pod and in local mode."""

from __future__ import annotations

import math
import os

import pytest

from throttledjob.contracts.policy import Enforcement, Policy
from throttledjob.sidecar.cpu.cgroups.detection import detect
from throttledjob.sidecar.cpu.cgroups.local_quota import CgroupQuota
from throttledjob.sidecar.cpu.enforcement import (
    local_enforcer,
    local_plan,
    plan_as_written,
    pod_enforcer,
    pod_plan,
)
from throttledjob.sidecar.cpu.enforcer import SignalEnforcer
from throttledjob.sidecar.cpu.processes import ProcessTree

QUOTA = Policy(cpu_peak_cores=1.5, enforcement=Enforcement.QUOTA)


def test_in_a_pod_quota_holds_only_by_a_limit_at_or_under_the_target() -> None:
    # The operator's limits hold the target: the sidecar only paces reported steps.
    for limit in (1.5, 0.9):
        plan = pod_plan(QUOTA, limit)
        assert plan.enforcement is Enforcement.COOPERATIVE and plan.enforcer is None
        assert f"CPU limit of {limit:g} cores" in plan.reason
    # No limit read (a container's removed), or a target lowered live under the running
    # pod's limit: signals and pacing hold it.
    for limit in (math.inf, 2.0):
        plan = pod_plan(QUOTA, limit)
        assert plan.enforcement is Enforcement.BOTH and plan.enforcer == "signals"
        assert plan.reason.startswith("signals and pacing (")
    # Not read yet (the workload has not started): the operator's word, in the policy,
    # stands; where it could not set limits, it wrote Both (operator/quota.py).
    plan = pod_plan(QUOTA, None)
    assert plan.enforcement is Enforcement.COOPERATIVE and "set by the operator" in plan.reason
    assert pod_plan(Policy(cpu_peak_cores=1.5, enforcement=Enforcement.BOTH), None).enforcer \
        == "signals"
    assert pod_plan(Policy(enforcement=Enforcement.QUOTA), 1.0).enforcement \
        is Enforcement.BOTH
    # Other enforcements are the user's choice, limit or not.
    for e in (Enforcement.SIGNALS, Enforcement.BOTH, Enforcement.COOPERATIVE):
        assert pod_plan(Policy(cpu_peak_cores=1.0, enforcement=e), 1.0).enforcement is e


@pytest.mark.parametrize("limit, lifted, enforcement", [
    (1.0, None, "cooperative"),   # the operator's limit at the target: the kernel holds it
    (2.0, None, "both"),          # over the target (a live edit lowered it): signals too
    (1.6, 1.6, "cooperative"),    # lifted for the budget, as the sidecar asked: no signals
    (1.605, 1.6, "cooperative"),  # the lift as the operator wrote it, in millicores
    (2.0, 1.6, "both"),           # more than the budget asked for: signals hold the rest
])
def test_a_limit_the_budget_lifted_still_counts_as_holding_the_target(
        limit: float, lifted: float | None, enforcement: str) -> None:
    written = Policy(cpu_peak_cores=1.0, enforcement=Enforcement.QUOTA)
    assert str(pod_plan(written, limit, lifted).enforcement) == enforcement


def test_signals_are_never_planned_for_processes_not_known_to_be_the_pods() -> None:
    plan = pod_plan(Policy(cpu_peak_cores=1.0, enforcement=Enforcement.SIGNALS), None,
                    scoped=False)
    assert plan.enforcer is None and "not known" in plan.reason
    tree = ProcessTree(root_pid=os.getpid())
    assert pod_enforcer(plan, tree, "/nonexistent") is None
    scoped = pod_plan(Policy(cpu_peak_cores=1.0, enforcement=Enforcement.SIGNALS), None)
    enforcer = pod_enforcer(scoped, tree, "/nonexistent")
    assert isinstance(enforcer, SignalEnforcer)
    enforcer.close()


def test_the_plan_says_who_holds_the_workload_and_when() -> None:
    kernel = plan_as_written(QUOTA)
    assert kernel.kernel_quota and kernel.enforcer_always and not kernel.pacing
    both = plan_as_written(Policy(cpu_peak_cores=1.0, enforcement=Enforcement.BOTH))
    assert both.pacing and not both.enforcer_always and both.enforcer == "signals"
    coop = plan_as_written(Policy(cpu_peak_cores=1.0, enforcement=Enforcement.COOPERATIVE))
    assert coop.pacing and coop.enforcer is None and not coop.kernel_quota
    # In a pod the containers' limit is not a quota of ours: the controller keeps its
    # margin and the time held back is the kernel's, reported apart (ContainerQuota).
    assert not pod_plan(QUOTA, 1.5).kernel_quota


def test_local_mode_sets_a_kernel_quota_where_the_machine_allows_one() -> None:
    found = detect()
    plan = local_plan(QUOTA, found)
    enforcer = local_enforcer(plan, ProcessTree(root_pid=os.getpid()), os.getpid(), found)
    try:
        if found.backend is None:  # a machine whose cgroups we may not write
            assert isinstance(enforcer, SignalEnforcer) and not plan.kernel_quota
        else:
            assert isinstance(enforcer, CgroupQuota) and plan.kernel_quota
            assert plan.reason.startswith("kernel quota (")
    finally:
        enforcer.close()
    # Asked for signals, it never looks for a quota.
    signals = local_plan(Policy(cpu_peak_cores=1.0, enforcement=Enforcement.SIGNALS), None)
    assert signals.enforcer == "signals" and signals.reason == "signals"
