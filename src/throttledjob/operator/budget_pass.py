"""One pass over a ThrottleBudget, every status interval (poller.py): observe its members
(the Running ThrottledJobs of its namespace its selector picks, and what their own passes
last read of their sidecars: fleet.py), decide the split (fleet_split.py, pure), apply:
the shares into the fleet's record, the budget's status, and a pass for each member
whose share moved (reconcile.rebudget), which holds its policy and its pods' limits to
it. A member that finishes leaves the split at the next pass; its share goes to the
others. With `floorsOverBudget: Suspend`, where even the members' floors pass the budget,
the lowest-priority members queued by Kueue are suspended (their Workloads deactivated)
until the others' fit, and resumed once theirs fit again.
"""

from __future__ import annotations

import datetime
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from throttledjob.contracts.policy import Policy
from throttledjob.contracts.status import finite_number

from . import child, conditions
from .api_names import GROUP, PLURAL, VERSION
from .budget_crd import BUDGET_PLURAL, MAX_MEMBERS
from .budget_spec import cores_now, selects, watts_now
from .conditions import Phase
from .cpu_limits import cores
from .fleet import CPU, GPU, Fleet, TjKey, millicores, template_gpus
from .fleet_split import Member, Split, split, to_suspend
from .job_split import job_scoped, rank_floor
from .kube import ApiError
from .kueue import PRIORITY_LABEL as KUEUE_PRIORITY_LABEL
from .kueue import queued_tj
from .reconcile import rebudget
from .state import OperatorState

PRIORITY_LABEL = "throttledjob.io/priority"
SUSPEND = "Suspend"  # spec.floorsOverBudget
# A member is weighed by its demand once this many reads of it are whole (each brings
# the seconds since the last); before, it keeps the share it had (after a restart: the
# one the budget's status shows).
MIN_READS = 3
# A share that moved less than this part is not worth a pass of the member.
MOVE_STEP = 0.05
# The status's figures of each resource, set by each split.
RESOURCE_FIGURES = ("cpuBudgetCores", "cpuFloorCores", "cpuCores", "gpuBudgetWatts",
                    "gpuFloorWatts", "gpuDemandWatts")


def budget_path(namespace: str, name: str = "") -> str:
    base = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/{BUDGET_PLURAL}"
    return f"{base}/{quote(name)}" if name else base


# The phases of a member: its pods run, or are about to (None: its Job not made yet).
MEMBER_PHASES = (None, Phase.PENDING, Phase.RUNNING)


def members_of(budget: Mapping[str, Any], tjs: Sequence[Mapping[str, Any]]
               ) -> list[Mapping[str, Any]]:
    """The ThrottledJobs the budget's selector picks whose pods run or are about to (not
    those Kueue holds, nor finished ones), by name."""
    return sorted((tj for tj in tjs if (tj.get("status") or {}).get("phase") in MEMBER_PHASES
                   and _selected(budget, tj)),
                  key=lambda tj: tj["metadata"]["name"])[:MAX_MEMBERS]


def _selected(budget: Mapping[str, Any], tj: Mapping[str, Any]) -> bool:
    """The budget's selector picks the ThrottledJob, and it is not being deleted."""
    meta = tj.get("metadata") or {}
    return not meta.get("deletionTimestamp") and selects(
        (budget.get("spec") or {}).get("selector"), meta.get("labels"))


def split_for_new_member(state: OperatorState, namespace: str) -> None:
    """A ThrottledJob about to make its Job: each budget of its namespace splits now, so
    a budget that picks it gives it a share (and shrinks the others' pods) before its
    pods start, rather than at the next tick with its pods at its own target."""
    for ns, name in sorted(state.budgets):
        if ns == namespace:
            budget_pass(state, ns, name)


def settle_new_member(state: OperatorState, namespace: str, name: str) -> None:
    """After a new member's children are made: a budget that split while they were being
    made (for another new member, in another handler) moved its share when it had no Job
    to pass over, and its ConfigMap was written with the share before; one pass now holds
    its policy to the share it has (nothing to write where it already does)."""
    if any(ns == namespace for ns, _ in state.budgets):
        rebudget(state, namespace, name)


def member(tj: Mapping[str, Any], fleet: Fleet, budget: str,
           last: Mapping[str, float]) -> Member:
    """A ThrottledJob as the CPU split sees it: its demand, floor, own target (job-wide),
    maxSlowdown and priority; `last`: the shares the budget's status shows."""
    meta, spec = tj["metadata"], tj.get("spec") or {}
    key = (meta.get("namespace", ""), meta["name"])
    throttle = spec.get("throttle") or {}
    pods = fleet.pods.get(key) or child.pods_at_once(spec)
    own = cores(((throttle.get("targets") or {}).get("cpu") or {}).get("peak"))
    cap = None if own is None else (own if job_scoped(spec) else own * pods)
    floor = fleet.floors.get(key) or sum(
        count * rank_floor(pod.get("containers") or [])
        for _, count, pod in child.pod_groups(spec)) or rank_floor([])
    measured = fleet.reads.get(key, 0) >= MIN_READS
    demand = tuple(fleet.demand.get(key) or ()) if measured else ()
    return _weighed(tj, fleet, demand, floor, cap, _had(fleet.shares, key, budget, last))


def gpu_member(tj: Mapping[str, Any], fleet: Fleet, budget: str,
               last: Mapping[str, float]) -> Member | None:
    """A ThrottledJob as the GPU-watt split sees it (None: it has no GPUs): what its GPUs
    would draw unheld, the least their limits go to, its own power target over them all."""
    meta, spec = tj["metadata"], tj.get("spec") or {}
    key = (meta.get("namespace", ""), meta["name"])
    gpus = fleet.gpus.get(key) or template_gpus(spec)
    if not gpus:
        return None
    own = finite_number((((spec.get("throttle") or {}).get("targets") or {}).get("gpu") or {})
                        .get("peakPowerWatts"))
    measured = fleet.reads.get(key, 0) >= MIN_READS and bool(fleet.gpu_demand.get(key))
    demand = tuple(fleet.gpu_demand.get(key) or ()) if measured else ()
    return _weighed(tj, fleet, demand, fleet.gpu_floors.get(key, 0.0),
                    None if own is None else own * gpus,
                    _had(fleet.watts, key, budget, last))


def _had(shares: Mapping[TjKey, Mapping[str, float]], key: TjKey, budget: str,
         last: Mapping[str, float]) -> float | None:
    """The share the member had of `budget` (after a restart: the one its status shows)."""
    return (shares.get(key) or {}).get(budget, last.get(key[1]))


def _weighed(tj: Mapping[str, Any], fleet: Fleet, demand: tuple[float, ...], floor: float,
             cap: float | None, had: float | None) -> Member:
    """The member of a split, from what it is weighed by in that resource."""
    meta, spec = tj["metadata"], tj.get("spec") or {}
    key = (meta.get("namespace", ""), meta["name"])
    # Running pods hold the share they had until measured (after a restart: the status's);
    # a member whose pods have not started yet is split anew, at an even share.
    running = (tj.get("status") or {}).get("phase") == Phase.RUNNING
    held = had if ((running and not demand) or not fleet.answered.get(key, True)) else None
    # Its own label, else its Workload's priority (Kueue's WorkloadPriorityClass).
    try:
        priority = int((meta.get("labels") or {})[PRIORITY_LABEL])
    except (KeyError, ValueError):
        priority = fleet.priorities.get(key, 0)
    max_slowdown = (spec.get("throttle") or {}).get("maxSlowdown") or Policy().max_slowdown
    return Member(meta["name"], demand, floor, cap, float(max_slowdown), priority, held)


def priority_known(tj: Mapping[str, Any], fleet: Fleet) -> bool:
    """Whether the member's priority is known: its own label, or no Kueue priority class,
    or its Workload's priority read (a member just made has none yet: no member is
    suspended while another's priority is unknown, lest a higher one go for a lower)."""
    meta = tj["metadata"]
    labels = meta.get("labels") or {}
    return (PRIORITY_LABEL in labels or KUEUE_PRIORITY_LABEL not in labels
            or (meta.get("namespace", ""), meta["name"]) in fleet.priorities)


def suspended_here(budget: Mapping[str, Any], tjs: Sequence[Mapping[str, Any]],
                   fleet: Fleet) -> list[Mapping[str, Any]]:
    """The ThrottledJobs the budget keeps suspended (as its status or the fleet's record
    shows), still picked and not finished: weighed again each pass, to resume them."""
    meta = budget["metadata"]
    names = set((budget.get("status") or {}).get("suspended") or []) | {
        k[1] for k, b in fleet.suspended.items() if k[0] == meta["namespace"] and
        b == meta["name"]}
    return [tj for tj in tjs if tj["metadata"]["name"] in names
            and (tj.get("status") or {}).get("phase") not in (Phase.SUCCEEDED, Phase.FAILED)
            and _selected(budget, tj)]


@dataclass(frozen=True)
class Weighed:
    """One resource's split of a budget: the budget in force (cores, or watts for GPU),
    its members and the split."""

    resource: str
    budget: float
    members: Sequence[Member]
    out: Split


def _amount(resource: str, value: float) -> str:
    return f"{value:.3g} cores" if resource == CPU else f"{value:.4g} W of GPU power"


def next_status(budget: Mapping[str, Any], splits: Sequence[Weighed], source: str,
                fleet: Fleet, namespace: str, now: str,
                suspended: Sequence[str] = ()) -> dict[str, Any]:
    """The budget's status after its splits (one a resource); `suspended`: the members
    it suspends."""
    listed = _rows(budget["metadata"]["name"], splits, fleet, namespace)
    status = {k: v for k, v in (budget.get("status") or {}).items()
              if k not in RESOURCE_FIGURES}  # those of a resource it no longer has go
    for w in splits:
        if w.resource == CPU:
            status.update({
                "cpuBudgetCores": round(w.budget, 3), "cpuFloorCores": round(w.out.floor, 3),
                "cpuCores": round(sum(fleet.use.get((namespace, m.name), 0.0)
                                      for m in w.members), 3)})
        else:
            status.update({
                "gpuBudgetWatts": round(w.budget, 1), "gpuFloorWatts": round(w.out.floor, 1),
                "gpuDemandWatts": round(sum(sum(m.demand) / len(m.demand)
                                            for m in w.members if m.demand), 1)})
    status.update({
        "observedGeneration": budget["metadata"].get("generation"),
        "budgetSource": source, "splitTime": now, "members": listed,
        "suspended": sorted(suspended),
        "conditions": conditions.set_condition(
            status.get("conditions"), "BudgetMet", *_met(splits, listed, suspended), now,
            budget["metadata"].get("generation")),
    })
    return status


def _rows(name: str, splits: Sequence[Weighed], fleet: Fleet,
          namespace: str) -> list[dict[str, Any]]:
    """The members as the budget's status lists them, one row each, by name."""
    rows: dict[str, dict[str, Any]] = {}
    for w in splits:
        unit = "Cores" if w.resource == CPU else "Watts"
        for m, s in zip(w.members, w.out.shares, strict=True):
            row = rows.setdefault(m.name, {"name": m.name, "slowdown": 1.0,
                                           "withinMaxSlowdown": True, "read": True,
                                           "priority": m.priority})
            row[f"share{unit}"] = (millicores(s.cores) / 1000 if w.resource == CPU
                                   else math.floor(s.cores))
            row["slowdown"] = max(row["slowdown"], round(s.slowdown, 3))
            row["withinMaxSlowdown"] = row["withinMaxSlowdown"] and s.within_budget
            row["read"] = row["read"] and m.held is None and bool(m.demand)
            if m.demand:
                row[f"demand{unit}"] = round(sum(m.demand) / len(m.demand), 3)
            if math.isfinite(m.max_slowdown):
                row["maxSlowdown"] = m.max_slowdown
            lowest = fleet.share((namespace, m.name), w.resource)
            if lowest and lowest[1] != name and lowest[0] < s.cores:
                row["heldBy"] = lowest[1]
    return sorted(rows.values(), key=lambda r: r["name"])


def _met(splits: Sequence[Weighed], listed: Sequence[Mapping[str, Any]],
         suspended: Sequence[str]) -> tuple[bool, str, str]:
    """The BudgetMet condition: (status, reason, message)."""
    over = [r["name"] for r in listed if not r["withinMaxSlowdown"]]
    short = [w for w in splits if not w.out.feasible]
    in_force = " and ".join(_amount(w.resource, w.budget) for w in splits)
    if short:
        return (False, "FloorOverBudget", "; ".join(
            f"the members' floors come to {_amount(w.resource, w.out.floor)}, over the "
            f"budget of {_amount(w.resource, w.budget)}" for w in short)
            + ": each is held at its floor")
    if suspended:
        return (True, "MembersSuspended",
                f"suspended, the lowest priority first, so that the others' floors fit the "
                f"budget of {in_force}: {', '.join(suspended)}")
    return (True, "Split", f"{len(listed)} member(s) held to {in_force}"
            + (f"; past their maxSlowdown (lowest priority first): {', '.join(over)}"
               if over else ""))


def budget_pass(state: OperatorState, namespace: str, name: str,
                _job: str | None = None) -> None:
    """Observe, split, apply (the module's docstring)."""
    kube, fleet = state.kube, state.fleet
    budget = kube.get(budget_path(namespace, name))
    if budget is None:
        return
    tjs = kube.list(f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/{PLURAL}", "")
    spec = budget.get("spec") or {}
    picked = members_of(budget, tjs)
    picked += [tj for tj in suspended_here(budget, tjs, fleet) if tj not in picked]
    last = {resource: {r["name"]: r[field] for r in (budget.get("status") or {}).get(
        "members") or [] if field in r} for resource, field in ((CPU, "shareCores"),
                                                                (GPU, "shareWatts"))}
    now = datetime.datetime.now(datetime.timezone.utc)
    budget_cores, source = cores_now(spec, now)
    splits, suspend = [], set()
    if spec.get("cpu"):
        weighed = [member(tj, fleet, name, last[CPU]) for tj in picked]
        if spec.get("floorsOverBudget") == SUSPEND and all(
                priority_known(tj, fleet) for tj in picked):
            suspend = to_suspend(budget_cores, weighed, {
                tj["metadata"]["name"]: tj["metadata"].get("creationTimestamp", "")
                for tj in picked if queued_tj(tj)})
        elif spec.get("floorsOverBudget") == SUSPEND:
            # A member's priority not read yet (its Workload's): whom to stop waits for
            # it (a second or two), lest a higher one go in place of a lower.
            suspend = {tj["metadata"]["name"] for tj in picked
                       if fleet.suspended.get((namespace, tj["metadata"]["name"])) == name}
        members = [m for m in weighed if m.name not in suspend]
        splits.append(Weighed(CPU, budget_cores, members, split(budget_cores, members)))
    watts = watts_now(spec, now)
    if watts is not None:
        members = [m for m in (gpu_member(tj, fleet, name, last[GPU]) for tj in picked
                               if tj["metadata"]["name"] not in suspend) if m]
        splits.append(Weighed(GPU, watts, members, split(watts, members)))
    moved = set()
    # A resource the spec no longer has (an edit) is split as one with no members: each
    # member goes free of it.
    weighed_in = {w.resource for w in splits}
    for w in splits + [Weighed(r, 0.0, [], split(0.0, [])) for r in (CPU, GPU)
                       if r not in weighed_in]:
        moved |= _apply(fleet, namespace, name, tjs, w)
    for tj in tjs:
        key = (namespace, tj["metadata"]["name"])
        if (key[1] in suspend) != (fleet.suspended.get(key) == name):
            fleet.set_suspended(key, name if key[1] in suspend else None)
            moved.add(key[1])
    status = next_status(budget, splits, source, fleet, namespace, conditions.now_iso(),
                         sorted(suspend))
    kube.merge_patch(budget_path(namespace, name) + "/status", {"status": status})
    fleet.set_budget((namespace, name), status)
    for member_name in sorted(moved):
        rebudget(state, namespace, member_name)


def _apply(fleet: Fleet, namespace: str, budget: str, tjs: Sequence[Mapping[str, Any]],
           w: Weighed) -> set[str]:
    """The split's shares into the fleet's record; returns the members whose share moved
    (or went: those the budget no longer weighs in this resource go free of it)."""
    before = {m.name: fleet.share((namespace, m.name), w.resource) for m in w.members}
    moved = set()
    for tj in tjs:
        key = (namespace, tj["metadata"]["name"])
        if key[1] not in before and budget in (fleet.shares_of(w.resource).get(key) or {}):
            fleet.set_share(key, budget, None, w.resource)
            moved.add(key[1])
    for s in w.out.shares:
        fleet.set_share((namespace, s.name), budget, s.cores, w.resource)
    for m in w.members:
        was, now = before[m.name], fleet.share((namespace, m.name), w.resource)
        if now and (was is None or abs(now[0] - was[0]) > MOVE_STEP * max(was[0], 0.01)):
            moved.add(m.name)
    return moved


def remember_suspended(state: OperatorState, namespaces: Sequence[str],
                       logger: logging.Logger) -> None:
    """At the operator's start, before any watch: the members each budget's status shows
    it keeps suspended stay so until its first pass decides again, rather than a member's
    own pass finding no suspension on record and resuming it in between. `namespaces`:
    the watched ones (none: all). A budget that cannot be listed is logged and skipped:
    its members are then resumed and suspended again at its first pass."""
    for namespace in namespaces or [None]:
        path = (budget_path(namespace) if namespace
                else f"/apis/{GROUP}/{VERSION}/{BUDGET_PLURAL}")
        try:
            budgets = state.kube.list(path, "")
        except (ApiError, OSError) as e:
            logger.warning("cannot list ThrottleBudgets (%s): %s", path, e)
            continue
        for budget in budgets:
            meta = budget["metadata"]
            for member_name in (budget.get("status") or {}).get("suspended") or []:
                key = (meta["namespace"], member_name)
                if key not in state.fleet.suspended:
                    state.fleet.set_suspended(key, meta["name"])


def forget_budget(state: OperatorState, namespace: str, name: str) -> None:
    """The budget is gone: its members go back to their own targets (or another's)."""
    fleet = state.fleet
    fleet.set_budget((namespace, name), None)
    held = {k for resource in (CPU, GPU) for k, by in list(fleet.shares_of(resource).items())
            if k[0] == namespace and name in by}
    held |= {k for k, b in list(fleet.suspended.items()) if k[0] == namespace and b == name}
    for key in sorted(held):
        fleet.set_share(key, name, None)
        fleet.set_share(key, name, None, GPU)
        if fleet.suspended.get(key) == name:
            fleet.set_suspended(key, None)
        rebudget(state, *key)
