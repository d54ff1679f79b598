"""One pass over a ThrottledJob: observe, decide, apply; the one path that writes its
children, its pods' limits and its status.

Every trigger leads here with what it looked at (observe.py):
- the spec, created, resumed after a restart or edited (handlers.reconcile): before the
  child is made, the pass makes it (create.py); after, it compares the spec with the
  child, the ConfigMap and Kueue's Workload;
- the child's watch (handlers.job_event), with the child as the event shows it;
- the poller's ticks (poller.py): the sidecars of a Running ThrottledJob
  (read_sidecars), the Workload of one Kueue holds (read_queue), and the child of an
  unfinished one, level-triggered, for events lost to a restart (resync_from_job).

Each pass parses the policy once, decides its writes in pure functions (writes.py) and
applies them in one order: the children, then one status write, then the events (only
for a write that happened), then the pods' limits. It compares what is with what
should be, never what changed, so it is safe to run again at any point: a pass stopped
between two writes is finished by the next.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf

from . import child
from .attach import labeled
from .children import configmap_name
from .conditions import now_iso
from .create import ensure_children
from .job_split import job_scoped, rank_floor
from .kueue import PRIORITY_LABEL as KUEUE_PRIORITY_LABEL
from .kueue import queued_by_kueue, workload_path
from .observe import (
    Found,
    Readings,
    Seen,
    get_child,
    job_pods,
    job_uid,
    labeled_pods,
    policy_seen,
    spec_seen,
    unthrottled_labeled,
    unthrottled_pods,
    workload,
)
from .observe import read_sidecars as read_reports
from .pod_limits import shrunk_applied
from .state import OperatorState
from .validation import SpecError, validate
from .writes import (
    FINISHED,
    Policy,
    Writes,
    cpu_target,
    decide,
    events_after,
    next_status,
)

# After a shrink of a job-wide split, how long the grows it makes room for wait for the
# kubelet to apply it, and how often they look (grow_into_shrinks).
SHRINK_WAIT_SECONDS = 5.0
SHRINK_CHECK_SECONDS = 0.25


def spec_pass(body: kopf.Body, state: OperatorState, logger: logging.Logger) -> None:
    """The spec, created, resumed or edited."""
    made = (body.status or {}).get("jobName")
    ns, name = body.meta.namespace or "", body.meta.name or ""
    if labeled(body.spec) and (body.status or {}).get("phase"):
        # Attached by label, once: no child to compare, the ConfigMap alone.
        _pass(state, body, policy_seen(state.kube, ns, name), read=None)
        return
    if not made:
        ensure_children(body, state, logger)
        return
    # The body as the watch showed it: its status may lag our own writes, so the status
    # write reads it anew.
    finished = (body.status or {}).get("phase") in FINISHED
    _pass(state, body, spec_seen(state.kube, ns, name, made, child.is_jobset(body.spec),
                                 finished), read=None)


def child_pass(state: OperatorState, namespace: str, name: str,
               current: Mapping[str, Any], owner_uid: str | None, deleted: bool) -> bool:
    """The child as its watch shows it (`deleted`: its last state). Returns whether the
    ThrottledJob `name` is its owner (`owner_uid`): the child of an earlier ThrottledJob
    of this name, deleted and made anew, is not its."""
    tj = state.kube.get(state.kube.tj_path(namespace, name))
    if tj is None or (owner_uid is not None and tj["metadata"].get("uid") != owner_uid):
        return False
    found = Found(current, (current.get("metadata") or {}).get("name", ""))
    _pass(state, tj, Seen(child=found, deleted=deleted), read=tj)
    return True


def resync_from_job(state: OperatorState, namespace: str, name: str,
                    job: str | None) -> None:
    """Level-triggered: the child as it is now (None: gone)."""
    if not job:
        return
    tj = state.kube.get(state.kube.tj_path(namespace, name))
    if tj is not None:
        current = get_child(state.kube, namespace, job, state.is_jobset(namespace, name))
        _pass(state, tj, Seen(child=Found(current, job)), read=tj)


def read_queue(state: OperatorState, namespace: str, name: str, job: str | None) -> None:
    """A child that Kueue queues: its Workload's admission, and the Workload held to the
    spec's suspend."""
    if not job:
        return
    kube = state.kube
    current = get_child(kube, namespace, job, state.is_jobset(namespace, name))
    tj = kube.get(kube.tj_path(namespace, name))
    if current is None or tj is None or not queued_by_kueue(current):
        return
    seen = Seen(child=Found(current, job), workload=workload(kube, namespace, current))
    _pass(state, tj, seen, read=tj)


def read_sidecars(state: OperatorState, namespace: str, name: str,
                  job: str | None = None) -> None:
    """What each running pod's sidecar says: the observed peaks, the split, the limits."""
    seen = _sidecars_seen(state, namespace, name, job)
    if seen is None:
        return
    # Read after the sidecars (up to their deadline each): the status write starts from it.
    tj = state.kube.get(state.kube.tj_path(namespace, name))
    if tj is None:
        return
    labels = (tj.get("metadata") or {}).get("labels") or {}
    if (job and seen.workload is None and KUEUE_PRIORITY_LABEL in labels
            and (namespace, name) not in state.fleet.priorities):
        # Its Kueue priority, for a ThrottleBudget's suspensions, until read once: one
        # admitted before any tick found it queued was never read by read_queue.
        current = seen.child.obj if seen.child else get_child(
            state.kube, namespace, job, state.is_jobset(namespace, name))
        seen = dataclasses.replace(seen, workload=workload(state.kube, namespace, current))
    _pass(state, tj, seen, read=tj)


def _sidecars_seen(state: OperatorState, namespace: str, name: str,
                   job: str | None) -> Seen | None:
    """The pods and their sidecars' reports (None: no child known yet); in attach mode
    also the pods that run unthrottled, and a workload named by reference as it is now."""
    kube = state.kube
    if (namespace, name) in state.labeled:
        return Seen(readings=dataclasses.replace(
            read_reports(state, namespace, name, "", labeled_pods(kube, namespace, name)),
            unthrottled=unthrottled_labeled(kube, namespace, name)))
    uid = job_uid(state, namespace, name, job)
    if not uid:
        return None
    readings = read_reports(state, namespace, name, uid, job_pods(kube, namespace, name, uid))
    if (namespace, name) not in state.attached or not job:
        return Seen(readings=readings)
    jobset = state.is_jobset(namespace, name)
    # Someone else's workload: no watch of ours sees it change (the operator's watch
    # takes children with its label), so each read looks at it; else its end showed
    # only at the next resync.
    return Seen(readings=dataclasses.replace(readings, unthrottled=unthrottled_pods(
                    kube, namespace, uid, jobset)),
                child=Found(get_child(kube, namespace, job, jobset), job))


def rebudget(state: OperatorState, namespace: str, name: str) -> None:
    """A ThrottleBudget moved this ThrottledJob's share (budget_pass.py): a pass as for
    its spec, which holds its policy and its pods' limits to the share."""
    tj = state.kube.get(state.kube.tj_path(namespace, name))
    if tj is None or (tj.get("status") or {}).get("phase") in FINISHED:
        return
    made = (tj.get("status") or {}).get("jobName")
    if labeled(tj.get("spec") or {}):
        _pass(state, tj, policy_seen(state.kube, namespace, name), read=tj)
    elif made:
        _pass(state, tj, spec_seen(state.kube, namespace, name, made,
                                   child.is_jobset(tj.get("spec") or {}), False), read=tj)


def policy_of(tj: Mapping[str, Any], state: OperatorState) -> Policy:
    """The spec's policy document, parsed once per pass, or why it is refused; under a
    ThrottleBudget, held to the lowest share one gives it (Fleet.held)."""
    try:
        doc = validate(tj, state.settings.allow_host_access, state.settings.jobsets)
    except SpecError as e:
        return e
    meta = tj.get("metadata") or {}
    return state.fleet.held((meta.get("namespace", ""), meta.get("name", "")), doc,
                            tj.get("spec") or {})


def _pass(state: OperatorState, tj: Mapping[str, Any], seen: Seen,
          read: Mapping[str, Any] | None) -> None:
    meta = tj.get("metadata") or {}
    key = (meta.get("namespace", ""), meta.get("name", ""))
    if seen.readings is not None:
        _record(state, tj, seen.readings)
    if seen.workload is not None and seen.workload.obj is not None:
        priority = (seen.workload.obj.get("spec") or {}).get("priority")
        if isinstance(priority, int):
            state.fleet.priorities[key] = priority
    apply(state, tj, seen, decide(tj, policy_of(tj, state), seen,
                                  state.fleet.suspended.get(key)), read)


def _record(state: OperatorState, tj: Mapping[str, Any], r: Readings) -> None:
    """What the sidecars said, for the ThrottleBudgets that hold this one (fleet.py)."""
    meta, spec = tj.get("metadata") or {}, tj.get("spec") or {}
    floor = sum(rank_floor(child.pod_containers(spec, p)) for p in r.pods
                if (p.get("metadata") or {}).get("uid") in r.reports)
    state.fleet.record((meta.get("namespace", ""), meta.get("name", "")), r.reports, floor,
                       answered=not r.failures)


def apply(state: OperatorState, tj: Mapping[str, Any], seen: Seen, writes: Writes,
          read: Mapping[str, Any] | None = None) -> None:
    """The writes of a pass, in order; `read`: `tj` as just read from the API, which the
    status write starts from (None: it reads anew)."""
    kube, meta = state.kube, tj.get("metadata") or {}
    ns, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid")
    _write_children(state, tj, seen, writes)
    now = now_iso()

    def mutate(status: dict[str, Any], fresh: Mapping[str, Any]) -> dict[str, Any]:
        if (fresh.get("metadata") or {}).get("uid") != uid:
            return status  # made anew since the pass looked: not the one it decided for
        return next_status(status, fresh, seen, writes, now)

    result = kube.update_status(ns, name, mutate, read)
    if result is None:
        return
    fresh, old, new = result
    kind = ((seen.child.obj if seen.child else None) or {}).get(
        "kind", child.kind(tj.get("spec") or {}))
    for e in events_after(old, new, writes, kind):
        kopf.event(fresh, type="Warning" if e.warning else "Normal", reason=e.reason,
                   message=e.message)
    _write_limits(state, fresh, seen, writes)


def _write_children(state: OperatorState, tj: Mapping[str, Any], seen: Seen,
                    writes: Writes) -> None:
    kube, meta = state.kube, tj.get("metadata") or {}
    cm_path = f"/api/v1/namespaces/{meta.get('namespace', '')}/configmaps"
    if writes.create_config_map is not None:
        kopf.adopt(writes.create_config_map, owner=tj)
        kube.create(cm_path, writes.create_config_map)
    if writes.config_map_data is not None:
        kube.merge_patch(f"{cm_path}/{configmap_name(meta.get('name', ''))}",
                         {"data": writes.config_map_data})
    if writes.child_patch is not None and seen.child and seen.child.obj is not None:
        current = seen.child.obj
        kube.merge_patch(child.path(meta.get("namespace", ""), current["metadata"]["name"],
                                    current.get("kind") == "JobSet"), writes.child_patch)
    if writes.workload_patch is not None and seen.workload and seen.workload.obj:
        kube.merge_patch(workload_path(seen.workload.obj), writes.workload_patch)


def _write_limits(state: OperatorState, tj: Mapping[str, Any], seen: Seen,
                  writes: Writes) -> None:
    """The pods' CPU limits (enforcement Quota; pod_limits.py): to what the sidecars just
    said, or, after a live edit of the target, to the new target now. A refused resize
    leaves the old limits: the sidecar then holds a lower target with signals, a higher
    one stays at the old limit."""
    if seen.readings is not None:
        r = seen.readings
        shrunk = state.limits.reconcile(tj, r.pods, r.reports, writes.target, writes.lift)
        if shrunk:
            grow_into_shrinks(state, tj, r.child_uid, r.reports, shrunk)
    elif writes.resize:
        resize_to_new_target(state, tj, writes.target)


def resize_to_new_target(state: OperatorState, tj: Mapping[str, Any],
                         target: float | None) -> None:
    """A live edit of the target, applied now, not at the next read: scope Pod moves
    every pod to it (no sidecar read: pod_limits.plan); scope Job reads the ranks'
    sidecars, as the split needs their figures (a rank not read keeps its limit, so with
    none read nothing moved until the next read)."""
    meta = tj.get("metadata") or {}
    ns, name = meta.get("namespace", ""), meta.get("name", "")
    if job_scoped(tj.get("spec") or {}):
        read_sidecars(state, ns, name, (tj.get("status") or {}).get("jobName"))
        return
    uid = state.job_uids.get((ns, name))
    if (ns, name) in state.labeled:
        pods = labeled_pods(state.kube, ns, name)
    else:
        pods = job_pods(state.kube, ns, name, uid) if uid else []
    state.limits.reconcile(tj, pods, None, target)


def grow_into_shrinks(state: OperatorState, tj: Mapping[str, Any], uid: str,
                      reports: Mapping[str, Mapping[str, Any]], shrunk: list[str]) -> None:
    """Once the kubelet has applied the split's shrinks (`shrunk`, pod uids), make the
    grows they leave room for, with the same reports; until then the grows cannot fit
    under the target. Waits up to SHRINK_WAIT_SECONDS (half the status interval at most):
    left to the next read, a grow came a whole status interval after its shrink, the
    rank it was for held back meanwhile."""
    meta = tj.get("metadata") or {}
    namespace, name = meta.get("namespace", ""), meta.get("name", "")
    deadline = time.monotonic() + min(SHRINK_WAIT_SECONDS,
                                      state.settings.status_interval_seconds / 2)
    while time.monotonic() < deadline and not state.stop.wait(SHRINK_CHECK_SECONDS):
        pods = job_pods(state.kube, namespace, name, uid)
        if shrunk_applied(pods, shrunk):
            # As it is now: a target cut meanwhile is not grown past.
            current = state.kube.get(state.kube.tj_path(namespace, name))
            if current is not None:
                target = cpu_target(current.get("spec") or {}, policy_of(current, state))
                state.limits.reconcile(current, pods, reports, target)
            return
