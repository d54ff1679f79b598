"""Making a ThrottledJob's children: the ConfigMap and the Job (or JobSet), created when
absent and never twice. Idempotent, so that a restart at any point (between the two
creates, before the status) ends with exactly one of each; the API server's refusals
said in the status and events. The first step of a pass (reconcile.py) until the child
is made."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, NoReturn

import kopf

from . import child, events
from .attach import THROTTLE_LABEL, WORKLOAD_REF, attached, labeled
from .children import build_child, build_configmap, left_by_predecessor, owned_by
from .conditions import (
    Condition,
    Reason,
    at_generation,
    now_iso,
    set_condition,
    status_attached_by_label,
    status_from_job,
    status_held_back,
    status_invalid,
    status_job_created,
    status_waiting,
)
from .kube import ApiError, Kube
from .kueue import queued_by_kueue
from .state import OperatorState
from .validation import Refusal, SpecError, quota_warning, signals_uid_warning, validate

# How often a ThrottledJob made anew looks again for its predecessor's Job to be gone.
PREDECESSOR_RETRY_SECONDS = 2
# How often an attached ThrottledJob looks again for a workload not yet made.
WORKLOAD_RETRY_SECONDS = 5


def _refuse(kube: Kube, body: kopf.Body, error: SpecError,
            generation: int | None) -> NoReturn:
    """A spec the operator will not run: status, a Warning event, no retry."""
    now = now_iso()
    kube.update_status(body.meta.namespace or "", body.meta.name or "",
                       lambda st, _: status_invalid(st, error.reason, str(error),
                                                      generation, now))
    kopf.warn(body, reason=error.reason, message=str(error))
    raise kopf.PermanentError(f"{error.reason}: {error}")


def set_one_condition(kube: Kube, body: kopf.Body, type_: Condition, ok: bool, reason: str,
                   message: str, observed: bool = False) -> None:
    """One condition of the ThrottledJob for this generation; `observed`: and the
    generation acted on (status.at_generation)."""
    now, generation = now_iso(), body.meta.get("generation")

    def mutate(st: dict[str, Any], _: Any) -> dict[str, Any]:
        out = at_generation(st, generation) if observed else dict(st)
        out["conditions"] = set_condition(out.get("conditions"), type_, ok, reason, message,
                                          now, generation)
        return out

    kube.update_status(body.meta.namespace or "", body.meta.name or "", mutate)


def _wait_for_predecessor(kube: Kube, body: kopf.Body, obj: Mapping[str, Any],
                          kind: str) -> None:
    """An object of our child's name left by an earlier ThrottledJob of this name (deleted,
    and made anew: what JobTemplateImmutable tells the user to do): wait for the garbage
    collector, and say so, rather than refuse the name for good."""
    if not left_by_predecessor(obj, body.meta.name or "", body.meta.uid or ""):
        return
    message = (f"{kind} {obj['metadata']['name']} of the ThrottledJob deleted before this "
               "one is still being removed by the garbage collector")
    set_one_condition(kube, body, Condition.READY, False, Reason.PREDECESSOR_PENDING, message)
    raise kopf.TemporaryError(message, delay=PREDECESSOR_RETRY_SECONDS)


def ensure_children(body: kopf.Body, state: OperatorState, logger: logging.Logger) -> None:
    """Create the ConfigMap and the Job when absent; idempotent, so a restart at any
    point (between the two creates, before the status) ends with exactly one of each."""
    kube, ns, name = state.kube, body.meta.namespace or "", body.meta.name or ""
    generation = body.meta.get("generation")
    try:
        doc = validate(body, state.settings.allow_host_access, state.settings.jobsets)
    except SpecError as e:
        _refuse(kube, body, e, generation)
    doc = state.fleet.held((ns, name), doc, body.spec)  # a ThrottleBudget's share, if any
    cm = build_configmap(name, body.spec, doc)
    kopf.adopt(cm, owner=body)
    cm_path = f"/api/v1/namespaces/{ns}/configmaps"
    if _create(kube, body, cm_path, cm, generation) is None:
        _existing(kube, body, f"{cm_path}/{cm['metadata']['name']}", "ConfigMap",
                  Refusal.CONFIG_MAP_NAME_TAKEN, generation)
        kube.merge_patch(f"{cm_path}/{cm['metadata']['name']}", {"data": cm["data"]})
    if attached(body.spec):
        _attach(kube, body, generation)
        return
    job = build_child(body, doc, state.settings)
    if body.spec.get("suspend") and queued_by_kueue(job):
        # Kueue admits a Job whose Workload is active at once; made suspended, the Job
        # could start before the Workload is held inactive. It is made on resume.
        kube.update_status(ns, name, lambda st, _: status_held_back(st, generation, now_iso()))
        return
    kopf.adopt(job, owner=body)
    kind = job["kind"]
    jobs_path = child.collection_path(ns, child.is_jobset(body.spec))
    try:
        current = _create(kube, body, jobs_path, job, generation)
    except ApiError as e:
        if e.status != 404:
            raise
        # No JobSet API in this cluster: say so, and look again later (it may be installed).
        message = f"cannot create the {kind}: {child.JOBSET_API} is not served ({e})"
        set_one_condition(kube, body, Condition.READY, False, Reason.CHILD_KIND_MISSING, message)
        kopf.warn(body, reason=Reason.CHILD_KIND_MISSING, message=message)
        raise kopf.TemporaryError(message, delay=60) from None
    created = current is not None
    if current is None:
        current = _existing(kube, body, f"{jobs_path}/{job['metadata']['name']}", kind,
                            Refusal.JOB_NAME_TAKEN, generation)
    now = now_iso()
    # The phase comes from the child as it is now: after a restart it may be running or
    # finished already, and its events may have been handled before this.
    kube.update_status(ns, name, lambda st, tj: status_from_job(status_job_created(
        st, job["metadata"]["name"], generation, now), child.as_job(current), tj, now))
    if created:
        logger.info("created %s %s", kind, job["metadata"]["name"])
        events.normal(body, reason=Reason.JOB_CREATED,
                      message=f"Created {kind} {job['metadata']['name']} and ConfigMap "
                              f"{cm['metadata']['name']}")
        for reason, warning in ((Reason.QUOTA_UNAVAILABLE, quota_warning(body, doc)),
                                (Reason.SIGNALS_MAY_FAIL, signals_uid_warning(body, doc))):
            if warning:
                kopf.warn(body, reason=reason, message=warning)


def _attach(kube: Kube, body: kopf.Body, generation: int | None) -> None:
    """Attach mode: the workload's Job or JobSet (a TrainJob's, of its name), looked for
    until it is there; by label, none to look for. Their pods are the webhook's to
    throttle (admission.py)."""
    ns, name = body.meta.namespace or "", body.meta.name or ""
    if labeled(body.spec):
        message = (f"throttles the pods of the workloads labeled {THROTTLE_LABEL}={name} "
                   "as they are created")
        kube.update_status(ns, name, lambda st, _: status_attached_by_label(
            st, message, generation, now_iso()))
        events.normal(body, reason=Reason.ATTACHED, message=f"Attached to the workloads "
                                                              f"labeled {THROTTLE_LABEL}={name}")
        return
    ref = body.spec[WORKLOAD_REF]
    kind, target = f"{ref['kind']} {ref['name']}", ref["name"]
    current = kube.get(child.path(ns, target, child.is_jobset(body.spec)))
    now = now_iso()
    if current is None:
        message = f"waiting for {kind} (workloadRef) to be created"
        kube.update_status(ns, name, lambda st, _: status_waiting(
            st, Reason.WORKLOAD_NOT_FOUND, message, generation, now))
        raise kopf.TemporaryError(message, delay=WORKLOAD_RETRY_SECONDS)
    message = f"attached to {kind}: its pods are throttled as they are created"
    kube.update_status(ns, name, lambda st, tj: status_from_job(status_job_created(
        st, target, generation, now, Reason.ATTACHED, message), child.as_job(current), tj, now))
    events.normal(body, reason=Reason.ATTACHED, message=f"Attached to {kind}")


def _create(kube: Kube, body: kopf.Body, path: str, obj: dict[str, Any],
            generation: int | None) -> dict[str, Any] | None:
    """kube.create of a child (None: one of its name exists), with the API server's
    refusals said: 400/422 refuse the spec for good (a field our checks do not read, such
    as backoffLimit: -1: asked again, it would be refused again, forever); 403 (an
    admission policy, a quota) says so in Ready and is retried with backoff."""
    kind = obj.get("kind", "object")
    try:
        return kube.create(path, obj)
    except ApiError as e:
        if e.status in (400, 422):
            _refuse(kube, body, SpecError(Refusal.INVALID_JOB_TEMPLATE, f"the API server "
                    f"refused the {kind}: {e}"), generation)
        if e.status == 403:
            set_one_condition(kube, body, Condition.READY, False, Reason.CHILD_FORBIDDEN,
                           f"cannot create the {kind}: {e}")
        raise


def _existing(kube: Kube, body: kopf.Body, path: str, kind: str, taken: Refusal,
              generation: int | None) -> dict[str, Any]:
    """The object of a child's name that its create found: ours (a retry after a lost
    answer, a restart); one an earlier ThrottledJob of this name left, waited for; gone
    since the create (collected), tried again; else the name is refused."""
    existing = kube.get(path)
    if existing is None:
        raise kopf.TemporaryError(f"{kind} {path.rsplit('/', 1)[1]} went while the create "
                                  "met it: trying again", delay=PREDECESSOR_RETRY_SECONDS)
    if not owned_by(existing, body.meta.uid or ""):
        _wait_for_predecessor(kube, body, existing, kind)
        _refuse(kube, body, SpecError(taken, f"{kind} {path.rsplit('/', 1)[1]} exists and "
                                             "is not owned by this ThrottledJob"), generation)
    return existing
