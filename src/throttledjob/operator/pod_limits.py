"""The one writer of a running Job's pod CPU limits (enforcement Quota), level-triggered
as jobset's reconciler is: `plan` works out, from the spec and what the sidecars last
said, the limits every pod should have; `PodLimits.reconcile` makes it so (`pods/resize`)
and remembers what the API server refused. Creation writes the same limits into the pod
template (children.build_child, through cpu_limits.apply); after that, a live edit of the
target and each read of the sidecars call `reconcile`, both from a reconcile pass
(reconcile.py), and nothing else resizes a pod.

What a pod should have:
- scope Pod: the target, or more where its sidecar says the slowdown budget needs more
  (`cpuLimitWantedCores`, up to what Kueue admitted where it queues the Job), split among
  the workload containers by what each wanted (`cpuDemandCores`). After a live edit,
  which reads no sidecar, every pod goes to the new target (the next read lifts it
  again where the budget needs it); on a read, a pod whose sidecar did not answer keeps
  its limits, so that a slow answer does not resize it back and forth.
- scope Job: its part of the job-wide target (job_split.py); a pod not read keeps its
  limit.

The sidecar has no API token: it says what it wants in /status and the operator applies
it. What it may get is bounded where every resize is: a namespace's ResourceQuota on
`limits.cpu` and the cluster's admission policies on `pods/resize` apply. A limit over
what the node has holds nothing back; it asks no room of the node, as the request the
API server defaulted is not raised with it (cpu_limits.resize).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import kopf

from . import child, cpu_limits, events, metrics
from .conditions import Reason
from .job_split import (
    Rank,
    applied_limit,
    job_scoped,
    moves,
    rank_floor,
    ranks,
    shares,
    split_message,
    terminating,
)
from .kube import ApiError, Kube
from .kueue import queued_tj

# A lift of a pod's CPU limits smaller than this share of them is not applied; nor is a
# change of the split among its containers.
LIFT_STEP = 0.1

TjKey = tuple[str, str]  # (namespace, name)
Reports = Mapping[str, Mapping[str, Any]]  # pod uid -> its sidecar's /status


@dataclass(frozen=True)
class Resize:
    """One pod's workload limits to move."""

    pod: Mapping[str, Any]
    total: float  # the summed limit, cores
    target: float  # the pod's own target: a total over it is a lift
    demand: Mapping[str, float]  # its split among the containers (cpu_limits.shares)
    tolerance: float = 0.0  # a container within this share of its new limit is left
    rank: Rank | None = None  # scope Job: the rank it moves


def _uid(pod: Mapping[str, Any]) -> str:
    return (pod.get("metadata") or {}).get("uid", "")


def job_ranks(spec: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], reports: Reports,
              held: Sequence[str], now: float | None = None) -> list[Rank]:
    """scope Job: the Job's pods as the split sees them; `held` keep their limits; `now`
    (Unix seconds) tells the ranks still starting (None: none is)."""
    return ranks(pods, reports, lambda pod: rank_floor(child.pod_containers(spec, pod)),
                 held, now)


def plan(tj: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], reports: Reports | None,
         refused: Mapping[str, float], target: float | None, now: float | None = None,
         lift: bool = True) -> tuple[list[Resize], list[Rank]]:
    """The resizes that bring every pod to the limits it should have, in order (shrinks
    first under scope Job), and the ranks under scope Job. `reports`: the sidecars read
    (pod uid -> /status), None for a live edit, which reads none. `refused`: pod uid ->
    a total the API server refused it, not asked for again. `target`: the CPU target the
    kernel holds (writes.cpu_target; None: none, and nothing moves). `now` (Unix
    seconds): under scope Job the split waits for ranks still starting
    (job_split.settled). `lift` False: the target holds whatever a sidecar asks (hold
    Hard, as a ThrottleBudget's share is held)."""
    spec = tj.get("spec") or {}
    if target is None:
        return [], []
    if job_scoped(spec):
        ranks_ = job_ranks(spec, pods, reports or {}, list(refused), now)
        by_uid = {_uid(p): p for p in pods}
        return [Resize(by_uid[r.uid], total, total,
                       cpu_limits.limits_by_name(by_uid[r.uid].get("spec") or {}), rank=r)
                for r, total in moves(target, ranks_, shares(target, ranks_))], ranks_
    out = []
    for pod in pods:
        if reports is not None and _uid(pod) not in reports:
            continue  # its sidecar did not answer this read: its limits stay
        report = (reports or {}).get(_uid(pod)) or {}
        # Kueue admitted the pod by its template's requests (a request left out defaults
        # to the limit, the target's share): no lift past them (kueue.py).
        ceiling = (cpu_limits.total_request({"containers": child.pod_containers(spec, pod)})
                   or target) if queued_tj(tj) else None
        total = limit_for(target, report.get("cpuLimitWantedCores") if lift else None,
                          ceiling)
        if refused.get(_uid(pod)) == total:
            continue
        # The width behind a lift is measured anew each interval: a lift within 10% of
        # the limits in force is not worth a resize (back to the target always is).
        now = cpu_limits.total_limit(pod.get("spec") or {})
        if total > target and now is not None and abs(total - now) <= LIFT_STEP * now:
            continue
        # Split by what each container wanted, or where the sidecar cannot say (its first
        # interval, an older sidecar, no read), as the limits are split now; where only
        # the split would move, a change within 10% of a container's limit is left.
        demand = report.get("cpuDemandCores") or cpu_limits.limits_by_name(
            pod.get("spec") or {})
        same_total = now is not None and abs(now - total) < 0.0005
        out.append(Resize(pod, total, target, demand, LIFT_STEP if same_total else 0.0))
    return out, []


def shrunk_applied(pods: Sequence[Mapping[str, Any]], shrunk: Sequence[str]) -> bool:
    """Whether the kubelet has applied the shrinks of `shrunk` (pod uids) among `pods`: no
    limit it runs them at is over their spec's (a pod gone has given its part back)."""
    for pod in pods:
        if _uid(pod) in shrunk:
            spec = cpu_limits.total_limit(pod.get("spec") or {})
            if spec is None or (applied_limit(pod) or 0.0) > spec + 1e-9:
                return False
    return True


def limit_for(target_cores: float, wanted_cores: float | None,
              ceiling_cores: float | None = None) -> float:
    """The pod's summed limit: the sidecar's where the budget needs more than the target,
    up to `ceiling_cores` (what Kueue admitted, where it queues the Job)."""
    if wanted_cores is None or wanted_cores <= target_cores:
        return target_cores
    return max(target_cores, min(wanted_cores, ceiling_cores or wanted_cores))


@dataclass
class PodLimits:
    """The writer: the API client, and per ThrottledJob the totals the API server refused
    its pods (only pods still listed are kept)."""

    kube: Kube
    refused: dict[TjKey, dict[str, float]] = field(default_factory=dict)

    def reconcile(self, tj: Mapping[str, Any], pods: Sequence[Mapping[str, Any]],
                  reports: Reports | None, target: float | None,
                  lift: bool = True) -> list[str]:
        """Every pod of `pods` (the Job's own) to the limits it should have; `reports`
        `target` and `lift` as for plan (reports None: a live edit). Returns the uids of the
        ranks it shrank (scope Job): their room is the grows' once the kubelet has
        applied them (shrunk_applied).
        Raises ApiError where a failure may pass (the caller retries)."""
        meta = tj.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        live = {_uid(p) for p in pods}
        # Kept in self while resizing, so a refusal is remembered even if a later one raises.
        refused = self.refused[key] = {
            uid: v for uid, v in self.refused.get(key, {}).items() if uid in live}
        resizes, ranks_ = plan(tj, pods, reports, refused, target, time.time(), lift)
        moved = []
        for r in resizes:
            template = child.pod_containers(tj.get("spec") or {}, r.pod)
            outcome = resize_pod(self.kube, tj, r.pod, r.total, r.target, template, r.demand,
                                 r.tolerance)
            if outcome is False:
                refused[_uid(r.pod)] = r.total
            elif outcome and r.rank is not None:
                moved.append((r.rank, r.total))
        if not refused:
            self.refused.pop(key, None)
        if moved:
            events.normal(tj, reason=Reason.SPLIT_CHANGED, message=split_message(moved, ranks_))
        return [r.uid for r, total in moved if total < r.limit]

    def forget(self, key: TjKey) -> None:
        """The ThrottledJob is gone."""
        self.refused.pop(key, None)


def resize_pod(kube: Kube, body: Mapping[str, Any], pod: Mapping[str, Any], total: float,
               target: float, template: Sequence[Mapping[str, Any]],
               demand: Mapping[str, float] | None = None,
               tolerance: float = 0.0) -> bool | None:
    """Move one Pending or Running pod's workload limits to shares of `total` cores (by
    each container's measured `demand` where known: cpu_limits.shares), unless each is
    within `tolerance` of its share already; a pod being deleted keeps its limits through
    its grace period (its sidecar has stood down: it asks for no lift, and a cut would
    slow its checkpoint). Returns None when there was nothing to do,
    True when resized, False when the API server refused (the old limits hold; a Warning
    says so). Raises ApiError when the failure may pass (retry)."""
    if (pod.get("status") or {}).get("phase") not in ("Pending", "Running") \
            or terminating(pod):
        return None
    patch = cpu_limits.resize(pod.get("spec") or {}, total, template, demand, tolerance,
                              (pod.get("status") or {}).get("qosClass") == "Guaranteed")
    if patch is None:
        return None
    name = pod["metadata"]["name"]
    try:
        kube.resize_pod(pod["metadata"]["namespace"], name, patch)
    except ApiError as e:
        if e.transient:
            raise
        metrics.RESIZES.labels("refused").inc()
        kopf.warn(body, reason=Reason.QUOTA_RESIZE_REFUSED,
                  message=f"pod {name}: CPU limits not resized to {total:g} cores ({e}); it "
                          "keeps the old ones")
        return False
    metrics.RESIZES.labels("applied").inc()
    containers = patch["spec"]["containers"]
    split = "" if len(containers) < 2 else " (" + ", ".join(
        f"{c['name']} {c['resources']['limits']['cpu']}" for c in containers) + ")"
    if total > target:
        events.normal(body, reason=Reason.QUOTA_LIFTED,
                  message=f"pod {name}: CPU limits lifted to {total:g} cores{split}: the "
                          f"{target:g}-core target would slow it more than maxSlowdown")
    else:
        events.normal(body, reason=Reason.QUOTA_RESIZED,
                  message=f"pod {name}: CPU limits resized to the {target:g}-core "
                          f"target{split}")
    return True
