"""What a reconcile pass looks at, read from the API and the sidecars; no writes.

Each trigger looks at what it needs (reconcile.py): a spec edit at the child, its
ConfigMap and Kueue's Workload; the child's watch brings the child itself; the poller's
status tick reads the pods and their sidecars, its queue tick the child and its
Workload. A part left None in `Seen` was not looked at, and the pass leaves what it
governs as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import child, metrics
from .attach import THROTTLE_LABEL, throttled
from .children import LABEL_NAME, configmap_name, job_owner_name, sidecar_endpoint
from .kube import ApiError, Kube
from .kueue import queued_by_kueue
from .pod_conditions import pending_resizes, stuck_containers
from .sidecar_status import StatusReadError
from .state import OperatorState


@dataclass(frozen=True)
class Found:
    """An object a pass looked for; `obj` None: not there."""

    obj: Mapping[str, Any] | None
    name: str = ""  # the name looked for


@dataclass(frozen=True)
class Readings:
    """The child's pods and what their sidecars said this tick."""

    child_uid: str
    pods: list[dict[str, Any]]
    reports: dict[str, dict[str, Any]]  # pod uid -> its sidecar's /status
    failures: list[str]  # the sidecars that did not answer, and why
    held: list[str] = field(default_factory=list)  # pod uids whose resize was refused
    # Attach mode: the workload's running pods that have no throttle (None: not looked at)
    unthrottled: list[str] | None = None

    @property
    def pending(self) -> list[str]:
        return pending_resizes(self.pods)

    @property
    def stuck(self) -> list[tuple[str, str]]:
        return stuck_containers(self.pods)


@dataclass(frozen=True)
class Seen:
    """What one pass looked at (None: not looked at)."""

    for_spec: bool = False  # a pass for the spec: it acts on the spec's generation
    child: Found | None = None  # the Job or JobSet
    deleted: bool = False  # the child as its watch last showed it, deleted
    config_map: Found | None = None
    workload: Found | None = None  # Kueue's Workload, where Kueue queues the child
    readings: Readings | None = None


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


def workload(kube: Kube, namespace: str, current: Mapping[str, Any] | None) -> Found | None:
    """Kueue's Workload of the child `current`, where Kueue queues it (None: it does not)."""
    if current is None or not queued_by_kueue(current):
        return None
    return Found(kube.workload_of(namespace, current["metadata"].get("uid", "")))


def spec_seen(kube: Kube, namespace: str, name: str, job: str, jobset: bool,
              finished: bool) -> Seen:
    """What a pass for the spec compares it with: the child, its ConfigMap, its Workload;
    nothing where the ThrottledJob has `finished` (its child's status says it all, and
    every finished one is resumed at each restart of the operator)."""
    if finished:
        return Seen(for_spec=True)
    current = get_child(kube, namespace, job, jobset)
    config_map = kube.get(f"/api/v1/namespaces/{namespace}/configmaps/{configmap_name(name)}")
    return Seen(for_spec=True, child=Found(current, job), config_map=Found(config_map),
                workload=workload(kube, namespace, current))


def policy_seen(kube: Kube, namespace: str, name: str) -> Seen:
    """What a pass for the spec of a ThrottledJob attached by label compares it with: its
    ConfigMap alone."""
    config_map = kube.get(f"/api/v1/namespaces/{namespace}/configmaps/{configmap_name(name)}")
    return Seen(for_spec=True, config_map=Found(config_map))


def job_uid(state: OperatorState, namespace: str, name: str, job: str | None) -> str | None:
    """The uid of the ThrottledJob's own child, as its watch showed it or read now."""
    uid = state.job_uids.get((namespace, name))
    if not uid and job:
        current = state.kube.get(child.path(namespace, job, state.is_jobset(namespace, name)))
        # An attached workload (attach.py) is someone else's: its name is what was asked.
        if current and (job_owner_name(current) == name
                        or (namespace, name) in state.attached):
            uid = state.job_uids[(namespace, name)] = current["metadata"]["uid"]
    return uid


def job_pods(kube: Kube, namespace: str, name: str, uid: str) -> list[dict[str, Any]]:
    """The pods of the ThrottledJob's own child: anyone may put the label on a pod of
    theirs, whose "sidecar" would then write our status (or stall our reads), or whose
    limits a live edit would resize."""
    return [p for p in kube.list_pods(namespace, f"{LABEL_NAME}={name}")
            if child.pod_belongs(p, uid)]


def unthrottled_pods(kube: Kube, namespace: str, uid: str, jobset: bool) -> list[str]:
    """Attach mode: the names of the attached child's pods, not finished, that were
    admitted without the throttle (the webhook down, or the pod older than its
    ThrottledJob)."""
    label = child.JOBSET_UID_LABEL if jobset else child.JOB_UID_LABEL
    return _unthrottled(kube.list_pods(namespace, f"{label}={uid}"))


def labeled_pods(kube: Kube, namespace: str, name: str) -> list[dict[str, Any]]:
    """Attach mode by label: the pods the webhook throttled for the ThrottledJob `name`.
    Any workload of the namespace joins it by its label (its maker's consent), so every
    pod with our label is one of its pods."""
    return kube.list_pods(namespace, f"{LABEL_NAME}={name}")


def unthrottled_labeled(kube: Kube, namespace: str, name: str) -> list[str]:
    """Attach mode by label: the names of the pods, not finished, that were admitted
    without the throttle: those labeled with its name themselves, and those of the Jobs
    so labeled (a CronJob's, whose label is on the Job, not its pods)."""
    selector = f"{THROTTLE_LABEL}={name}"
    pods = kube.list_pods(namespace, selector)
    uids = [j["metadata"]["uid"] for j in kube.list(child.collection_path(namespace, False),
                                                    selector)]
    if uids:
        pods += kube.list_pods(namespace, f"{child.JOB_UID_LABEL} in ({','.join(uids)})")
    return _unthrottled(pods)


def _unthrottled(pods: list[dict[str, Any]]) -> list[str]:
    return sorted({p["metadata"].get("name", "") for p in pods
                   if not throttled(p)
                   and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")})


def read_sidecars(state: OperatorState, namespace: str, name: str, child_uid: str,
                  pods: list[dict[str, Any]]) -> Readings:
    """Each pod's sidecar /status; one that does not answer within the reader's deadline
    is a failure, and its pod keeps its limits."""
    reports: dict[str, dict[str, Any]] = {}
    failures: list[str] = []
    for pod in pods:
        endpoint = sidecar_endpoint(pod)
        if endpoint is None:
            continue
        try:
            reports[pod["metadata"].get("uid", "")] = state.reader.read(*endpoint)
            metrics.SIDECAR_READS.labels("success").inc()
        except StatusReadError as e:
            failures.append(f"pod {pod['metadata'].get('name')}: {e}")
            metrics.SIDECAR_READS.labels("failure").inc()
    held = list(state.limits.refused.get((namespace, name), {}))
    return Readings(child_uid, pods, reports, failures, held)
