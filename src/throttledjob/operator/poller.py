"""The periodic work, without kopf timers: the sidecars' /status of Running ThrottledJobs
into status.observed, and the Job of unfinished ones into the phase (a level-triggered
safety net for Job events lost to an API failure or a restart).

kopf puts a finalizer on every object that has a timer or daemon, so a ThrottledJob could
not be deleted while the operator is down. One thread instead walks the ThrottledJobs
this process has seen (kopf's watch feeds `OperatorState.seen`, within the operator's
namespaces) and hands each one's reads to a pool.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import kopf

from . import child, events, metrics
from .children import LABEL_NAME, job_owner_name, sidecar_endpoint
from .job_split import Rank, job_scoped
from .kube import ApiError, Kube
from .kueue import active_patch, queued_by_kueue, workload_path
from .observed import status_with_observed, status_with_split
from .pod_conditions import (
    pending_resizes,
    status_with_resizes,
    status_with_stuck,
    stuck_containers,
)
from .pod_limits import PodLimits, job_ranks, shrunk_applied, target_of
from .settings import OperatorSettings
from .sidecar_status import StatusReader, StatusReadError
from .status import (
    GONE_REASONS,
    Condition,
    Phase,
    Reason,
    condition,
    now_iso,
    status_from_job,
    status_job_gone,
    status_with_admission,
)

# Threads reading sidecars and Jobs. A read holds one for at most the read deadline per
# pod, so a slow sidecar takes one thread, not the tick.
POLL_THREADS = 8
# After a shrink of a job-wide split, how long the grows it makes room for wait for the
# kubelet to apply it, and how often they look (grow_into_shrinks).
SHRINK_WAIT_SECONDS = 5.0
SHRINK_CHECK_SECONDS = 0.25

TjKey = tuple[str, str]  # (namespace, name)


@dataclass
class OperatorState:
    """What the handlers and the poller share; kopf's memo carries it (`memo.state`), so a
    test builds its own (settings, an API client, a reader) and calls them directly."""

    settings: OperatorSettings
    kube: Kube
    reader: StatusReader
    # (namespace, name) -> (phase, jobName) of every ThrottledJob the watch has shown.
    seen: dict[TjKey, tuple[str | None, str | None]] = field(default_factory=dict)
    # (namespace, ThrottledJob name) -> uid of its Job, as the Job watch showed it: only
    # pods that Job owns are ever read.
    job_uids: dict[TjKey, str] = field(default_factory=dict)
    # ThrottledJobs whose child is a JobSet, not a Job (child.py).
    jobsets: set[TjKey] = field(default_factory=set)
    stop: threading.Event = field(default_factory=threading.Event)
    # The one writer of the pods' CPU limits (pod_limits.py), with what it was refused.
    limits: PodLimits = field(init=False)
    # kopf.event/warn find kopf's event queue in context variables, set for handlers (not
    # yet for startup activities): the pool's threads run in a copy of a handler's.
    context: contextvars.Context | None = None

    def __post_init__(self) -> None:
        self.limits = PodLimits(self.kube)


Read = Callable[[OperatorState, str, str, str | None], None]


def child_path(state: OperatorState, namespace: str, name: str, job_name: str) -> str:
    """The API path of a ThrottledJob's Job or JobSet."""
    return child.path(namespace, job_name, (namespace, name) in state.jobsets)


def resync_from_job(state: OperatorState, namespace: str, name: str,
                    job_name: str | None) -> None:
    """Level-triggered: the Job (or JobSet) as it is now -> phase and conditions."""
    if not job_name:
        return
    sync_from_job(state, namespace, name, job_name, get_child(
        state.kube, namespace, job_name, (namespace, name) in state.jobsets))


def get_child(kube: Kube, namespace: str, job_name: str,
              jobset: bool) -> dict[str, Any] | None:
    """The ThrottledJob's Job (or JobSet, `jobset`) named `job_name`, or None where
    neither kind of that name is there: a spec switched between jobTemplate and
    jobSetTemplate after its child was made leaves the child of its first kind."""
    found = kube.get(child.path(namespace, job_name, jobset))
    if found is None:
        try:
            found = kube.get(child.path(namespace, job_name, not jobset))
        except ApiError as e:
            if e.status != 403:   # forbidden: the operator runs without that kind
                raise
    return found


def sync_from_job(state: OperatorState, namespace: str, name: str, job_name: str,
                  current: Mapping[str, Any] | None, owner_uid: str | None = None,
                  deleted: bool = False) -> bool:
    """The Job (or JobSet) `job_name` as it is now (`current`; None: not found) -> the
    ThrottledJob's phase and conditions, with an event where the phase changes
    (from_job). Returns whether the ThrottledJob was the Job's."""
    ours: list[bool] = []
    mutate = from_job(job_name, current, now_iso(), owner_uid, deleted, ours)
    post_phase_change(state.kube.update_status(namespace, name, mutate), job_name, current)
    return bool(ours and ours[0])


StatusChange = Callable[[dict[str, Any], Mapping[str, Any]], dict[str, Any]]


def from_job(job_name: str, current: Mapping[str, Any] | None, now: str,
             owner_uid: str | None = None, deleted: bool = False,
             ours: list[bool] | None = None) -> StatusChange:
    """The status change that the child `job_name` as it is now (`current`; None: not
    found) makes: its phase and conditions. A Job not found, or `deleted` (its watch's
    last state, `current`) before it finished: status_job_gone. `owner_uid`: only if the
    ThrottledJob has that uid (the Job of an earlier ThrottledJob of this name, deleted
    and made anew, is not its); whether it had is appended to `ours`."""
    job = child.as_job(current) if current is not None else None

    def mutate(st: dict[str, Any], tj: Mapping[str, Any]) -> dict[str, Any]:
        meta = tj.get("metadata") or {}
        if ours is not None:
            ours[:] = [owner_uid is None or meta.get("uid") == owner_uid]
        if owner_uid is not None and meta.get("uid") != owner_uid:
            return st
        out = status_from_job(st, job, tj, now) if job is not None else st
        if (job is None or deleted) and not meta.get("deletionTimestamp"):
            out = status_job_gone(out, job_name, now, deleted)
        return out

    return mutate


def post_phase_change(result: tuple[dict[str, Any], dict[str, Any], dict[str, Any]] | None,
                      job_name: str, current: Mapping[str, Any] | None) -> None:
    """The event of a status write (`result`, Kube.update_status's) that moved the phase."""
    if not result or result[1].get("phase") == result[2].get("phase"):
        return
    tj, _, new = result
    phase = new.get("phase")
    failed = condition(new, Condition.FAILED) or {}
    if phase == Phase.FAILED and failed.get("reason") in GONE_REASONS:
        kopf.warn(tj, reason=failed["reason"], message=failed.get("message", ""))
    else:
        post = kopf.warn if phase == Phase.FAILED else events.normal
        post(tj, reason=f"Job{phase}",
             message=f"{(current or {}).get('kind', 'Job')} {job_name} is {phase}")


def set_workload_active(kube: Kube, namespace: str, job: Mapping[str, Any],
                        suspend: bool) -> dict[str, Any] | None:
    """Hold Kueue's Workload of `job` inactive while the ThrottledJob asks to suspend, and
    active otherwise; returns the Workload (None: Kueue has not made it yet)."""
    uid = (job.get("metadata") or {}).get("uid", "")
    workload = kube.workload_of(namespace, uid)
    patch = active_patch(workload, suspend) if workload else None
    if workload and patch:
        kube.merge_patch(workload_path(workload), patch)
    return workload


def read_queue(state: OperatorState, namespace: str, name: str,
               job_name: str | None) -> None:
    """A Job that Kueue queues: its Workload's admission into the Admitted condition, and
    the Workload held to the ThrottledJob's suspend (a Workload made anew is active)."""
    kube = state.kube
    current = kube.get(child_path(state, namespace, name, job_name)) if job_name else None
    tj = kube.get(kube.tj_path(namespace, name))
    if current is None or tj is None or not queued_by_kueue(current):
        return
    job = child.as_job(current)
    workload = set_workload_active(kube, namespace, job,
                                   bool((tj.get("spec") or {}).get("suspend")))
    now = now_iso()
    kube.update_status(namespace, name, lambda st, fresh: status_with_admission(
        status_from_job(st, job, fresh, now), workload, fresh, now))


def job_pods(kube: Kube, namespace: str, name: str, job_uid: str) -> list[dict[str, Any]]:
    """The pods of the ThrottledJob's own Job: anyone may put the label on a pod of
    theirs, whose "sidecar" would then write our status (or stall our reads), or whose
    limits a live edit would resize."""
    return [p for p in kube.list_pods(namespace, f"{LABEL_NAME}={name}")
            if child.pod_belongs(p, job_uid)]


def read_sidecars(state: OperatorState, namespace: str, name: str,
                  job: str | None = None) -> None:
    """Observed peaks from each running pod's sidecar /status into status.observed."""
    kube = state.kube
    job_uid = state.job_uids.get((namespace, name))
    if not job_uid and job:
        current = kube.get(child_path(state, namespace, name, job)) or {}
        if job_owner_name(current) == name:
            job_uid = state.job_uids[(namespace, name)] = current["metadata"]["uid"]
    if not job_uid:
        return
    reports: list[dict[str, Any]] = []
    read: list[tuple[dict[str, Any], dict[str, Any]]] = []  # (pod, its sidecar's report)
    failures: list[str] = []
    pods = job_pods(kube, namespace, name, job_uid)
    pending, stuck = pending_resizes(pods), stuck_containers(pods)
    for pod in pods:
        endpoint = sidecar_endpoint(pod)
        if endpoint is None:
            continue
        try:
            reports.append(state.reader.read(*endpoint))
            read.append((pod, reports[-1]))
            metrics.SIDECAR_READS.labels("success").inc()
        except StatusReadError as e:
            failures.append(f"pod {pod['metadata'].get('name')}: {e}")
            metrics.SIDECAR_READS.labels("failure").inc()
    now = now_iso()
    by_uid = {pod["metadata"].get("uid", ""): report for pod, report in read}
    split: list[tuple[float, list[Rank]]] = []  # scope Job: the target and its ranks

    def mutate(st: dict[str, Any], tj: dict[str, Any]) -> dict[str, Any]:
        out = status_with_stuck(status_with_resizes(
            status_with_observed(st, reports, failures, now), pending, now), stuck, now)
        split[:] = [job_view(state, tj, pods, by_uid)] if job_scoped(tj.get("spec") or {}) \
            else []
        return status_with_split(out, *split[0], now) if split and split[0][1] else out

    result = kube.update_status(namespace, name, mutate)
    if result:
        tj, old, new = result
        was = condition(old, Condition.TARGET_MET) or {}
        is_ = condition(new, Condition.TARGET_MET) or {}
        if (is_.get("reason") == Reason.BUDGET_EXHAUSTED
                and was.get("reason") != Reason.BUDGET_EXHAUSTED):
            kopf.warn(tj, reason=Reason.TARGET_UNREACHABLE, message=is_.get("message", ""))
        started = condition(new, Condition.PODS_STARTED) or {}
        if started.get("status") == "False" and \
                (condition(old, Condition.PODS_STARTED) or {}).get("status") != "False":
            kopf.warn(tj, reason=Reason.POD_CANNOT_START, message=started.get("message", ""))
        shrunk = state.limits.reconcile(tj, pods, by_uid)
        if shrunk:
            grow_into_shrinks(state, tj, job_uid, by_uid, shrunk)


def resize_to_new_target(state: OperatorState, tj: Mapping[str, Any]) -> None:
    """A live edit of the target (enforcement Quota), applied now, not at the next read:
    scope Pod moves every pod to it (no sidecar read: pod_limits.plan); scope Job reads
    the ranks' sidecars, as the split needs their figures (a rank not read keeps its
    limit, so with none read nothing moved until the next read)."""
    meta = tj.get("metadata") or {}
    ns, name = meta.get("namespace", ""), meta.get("name", "")
    if job_scoped(tj.get("spec") or {}):
        read_sidecars(state, ns, name, (tj.get("status") or {}).get("jobName"))
        return
    job_uid = state.job_uids.get((ns, name))
    state.limits.reconcile(tj, job_pods(state.kube, ns, name, job_uid) if job_uid else [])


def grow_into_shrinks(state: OperatorState, tj: Mapping[str, Any], job_uid: str,
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
        pods = job_pods(state.kube, namespace, name, job_uid)
        if shrunk_applied(pods, shrunk):
            # As it is now: a target cut meanwhile is not grown past.
            current = state.kube.get(state.kube.tj_path(namespace, name))
            if current is not None:
                state.limits.reconcile(current, pods, reports)
            return


def job_view(state: OperatorState, tj: Mapping[str, Any], pods: list[dict[str, Any]],
             reports: Mapping[str, Mapping[str, Any]]) -> tuple[float, list[Rank]]:
    """scope Job, for the status: the job-wide target (0 where the spec has none) and the
    Job's pods as ranks; a pod whose resize was refused keeps its limit."""
    meta, spec = tj["metadata"], tj.get("spec") or {}
    held = list(state.limits.refused.get((meta.get("namespace", ""), meta.get("name", "")),
                                         {}))
    return target_of(spec) or 0.0, job_ranks(spec, pods, reports, held)


def due(seen: Mapping[TjKey, tuple[str | None, str | None]],
        resync: bool) -> list[tuple[Read, str, str, str | None]]:
    """This tick's reads: (function, namespace, name, Job name)."""
    work: list[tuple[Read, str, str, str | None]] = [
        (read_sidecars, ns, name, job) for (ns, name), (phase, job) in seen.items()
        if phase == Phase.RUNNING]
    # Waiting in Kueue's queue (or held by it): why, each tick.
    work += [(read_queue, ns, name, job) for (ns, name), (phase, job) in seen.items()
             if job and phase in (Phase.QUEUED, Phase.SUSPENDED)]
    if resync:
        work += [(resync_from_job, ns, name, job) for (ns, name), (phase, job) in seen.items()
                 if job and phase not in (Phase.SUCCEEDED, Phase.FAILED)]
    return work


def poll(state: OperatorState, logger: logging.Logger) -> None:
    """Every status interval: read_sidecars of Running ThrottledJobs; every resync
    interval: resync_from_job of unfinished ones.

    Each ThrottledJob's read goes to the pool on its own and the tick does not wait for
    it: a slow pod (it may dribble its answer up to the read deadline) delays only its
    own ThrottledJob's status. A read still running when its next is due is skipped, so a
    slow one never piles up in the pool."""
    settings = state.settings
    next_resync = time.monotonic() + settings.resync_seconds
    # Keys of the reads in flight; added by this thread, removed by the pool's (set.add
    # and set.discard are atomic).
    running: set[tuple[Read, str, str]] = set()
    with ThreadPoolExecutor(POLL_THREADS, thread_name_prefix="throttledjob-read") as pool:
        while not state.stop.wait(settings.status_interval_seconds):
            resync = time.monotonic() >= next_resync
            if resync:
                next_resync = time.monotonic() + settings.resync_seconds
            context = state.context or contextvars.copy_context()
            for fn, ns, name, job in due(dict(state.seen), resync):
                key = (fn, ns, name)
                if key in running:
                    metrics.SKIPPED.inc()
                    continue
                running.add(key)
                future = pool.submit(context.copy().run, fn, state, ns, name, job)
                future.add_done_callback(partial(_finished, running, key, logger))


def _finished(running: set[tuple[Read, str, str]], key: tuple[Read, str, str],
              logger: logging.Logger, future: Future[None]) -> None:
    running.discard(key)
    error = future.exception()
    if error is not None:  # the next tick tries again
        fn, ns, name = key
        metrics.PERIODIC_FAILURES.labels(fn.__name__).inc()
        logger.warning("%s %s/%s: %s", fn.__name__, ns, name, str(error) or type(error).__name__)
