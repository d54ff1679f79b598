"""The kopf handlers: each one reads, calls a builder, and writes.

Every decision lives in builders.py (pure, unit tested); these functions only move
objects between kopf, the builders and the API. Importing this module registers them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, NoReturn

import kopf

from . import builders as b
from .crd import GROUP, PLURAL, VERSION
from .kube import ApiError, Kube, load_client
from .sidecar_status import HttpStatusReader, StatusReader, StatusReadError

RESOURCE = (GROUP, VERSION, PLURAL)
SETTINGS = b.OperatorSettings.from_env()


@dataclass
class _Runtime:
    kube: Kube | None = None
    reader: StatusReader | None = None


RUNTIME = _Runtime()


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, logger: logging.Logger, **_: Any) -> None:
    # Keep kopf's progress and diff-base in annotations, not in status: the status schema
    # is strict (no x-kubernetes-preserve-unknown-fields), so status.kopf would be pruned.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    # No finalizer: children go by ownerReferences, so deleting a ThrottledJob never
    # waits for the operator (kopf adds one only for deletion handlers; there are none).
    settings.posting.level = logging.INFO
    # A watch that silently stalls (a proxy, a dead connection) is restarted.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    try:
        RUNTIME.kube = Kube(load_client())
    except Exception as e:  # the client's ConfigException and file errors alike
        # Retrying cannot conjure a kubeconfig: stop with the reason instead.
        raise kopf.PermanentError(f"cannot find the cluster (in-cluster service account, "
                                  f"KUBECONFIG or ~/.kube/config): {e}") from e
    RUNTIME.reader = RUNTIME.reader or HttpStatusReader(SETTINGS.status_timeout_seconds)
    logger.info("sidecar image %s, status every %gs", SETTINGS.sidecar_image,
                SETTINGS.status_interval_seconds)


def _kube() -> Kube:
    assert RUNTIME.kube is not None, "the startup handler did not run"
    return RUNTIME.kube


def _refuse(body: kopf.Body, error: b.SpecError, generation: int | None) -> NoReturn:
    """A spec the operator will not run: status, a Warning event, no retry."""
    now = b.now_iso()
    _kube().update_status(body.meta.namespace or "", body.meta.name or "",
                          lambda st, _tj: b.status_invalid(st, error, generation, now))
    kopf.warn(body, reason=error.reason, message=str(error))
    raise kopf.PermanentError(f"{error.reason}: {error}")


def _ensure(body: kopf.Body, logger: logging.Logger) -> None:
    """Create the ConfigMap and the Job when absent; idempotent, so a restart at any
    point (between the two creates, before the status) ends with exactly one of each."""
    kube, ns, name = _kube(), body.meta.namespace or "", body.meta.name or ""
    generation = body.meta.get("generation")
    try:
        doc = b.validate(body)
    except b.SpecError as e:
        _refuse(body, e, generation)
    cm = b.build_configmap(name, doc)
    kopf.adopt(cm, owner=body)
    cm_path = f"/api/v1/namespaces/{ns}/configmaps"
    if kube.create(cm_path, cm) is None:
        existing = kube.get(f"{cm_path}/{cm['metadata']['name']}") or {}
        if not b.owned_by(existing, body.meta.uid or ""):
            _refuse(body, b.SpecError("ConfigMapNameTaken", f"ConfigMap "
                                      f"{cm['metadata']['name']} exists and is not ours"),
                    generation)
        kube.merge_patch(f"{cm_path}/{cm['metadata']['name']}", {"data": cm["data"]})
    job = b.build_job(body, doc, SETTINGS)
    kopf.adopt(job, owner=body)
    jobs_path = f"/apis/batch/v1/namespaces/{ns}/jobs"
    created = kube.create(jobs_path, job) is not None
    if not created:
        existing = kube.get(f"{jobs_path}/{job['metadata']['name']}") or {}
        if not b.owned_by(existing, body.meta.uid or ""):
            _refuse(body, b.SpecError("JobNameTaken", f"Job {job['metadata']['name']} exists "
                                      "and is not owned by this ThrottledJob"), generation)
    now = b.now_iso()
    kube.update_status(ns, name, lambda st, _tj: b.status_job_created(
        st, job["metadata"]["name"], generation, now))
    if created:
        logger.info("created Job %s", job["metadata"]["name"])
        kopf.info(body, reason="JobCreated",
                  message=f"Created Job {job['metadata']['name']} and ConfigMap "
                          f"{cm['metadata']['name']}")
        warning = b.signals_uid_warning(body, doc)
        if warning:
            kopf.warn(body, reason="SignalsMayFail", message=warning)


@kopf.on.resume(*RESOURCE)
@kopf.on.create(*RESOURCE)
def ensure(body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    try:
        _ensure(body, logger)
    except ApiError as e:
        raise kopf.TemporaryError(str(e), delay=5) from e


@kopf.on.update(*RESOURCE, field="spec.throttle")
@kopf.on.update(*RESOURCE, field="spec.parameters")
def policy_changed(body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    """A live edit: rewrite the ConfigMap; the kubelet projects it into the running pod."""
    kube, generation = _kube(), body.meta.get("generation")
    if not (body.status or {}).get("jobName"):
        return ensure(body=body, logger=logger)  # refused before: maybe fixed now
    try:
        doc = b.validate(body)
    except b.SpecError as e:
        # The running pod keeps its last good policy; say why the edit was not applied.
        now, error = b.now_iso(), e
        _kube().update_status(body.meta.namespace or "", body.meta.name or "", lambda st, _tj: {
            **st, "conditions": b.set_condition(st.get("conditions"), "PolicyApplied", False,
                                                error.reason, str(error), now, generation)})
        kopf.warn(body, reason=e.reason, message=f"policy edit not applied: {e}")
        raise kopf.PermanentError(str(e)) from None
    cm = b.build_configmap(body.meta.name or "", doc)
    try:
        kube.merge_patch(f"/api/v1/namespaces/{body.meta.namespace}/configmaps/"
                         f"{cm['metadata']['name']}", {"data": cm["data"]})
        now = b.now_iso()
        kube.update_status(body.meta.namespace or "", body.meta.name or "", lambda st, _tj: {
            **st, "observedGeneration": generation,
            "conditions": b.set_condition(st.get("conditions"), "PolicyApplied", True,
                                          "ConfigMapUpdated", "the sidecar reads the new "
                                          "policy live", now, generation)})
    except ApiError as e:
        raise kopf.TemporaryError(str(e), delay=5) from e
    kopf.info(body, reason="PolicyUpdated",
              message=f"Updated ConfigMap {cm['metadata']['name']}; running pods apply it live")


@kopf.on.update(*RESOURCE, field="spec.jobTemplate")
def template_changed(body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    """A Job's pod template is immutable: say so instead of silently restarting."""
    job = (body.status or {}).get("jobName")
    if not job:
        return ensure(body=body, logger=logger)
    message = (f"jobTemplate changed, but Job {job} is already created and a Job's template "
               "is immutable; delete and re-create the ThrottledJob to run the new template")
    now, generation = b.now_iso(), body.meta.get("generation")
    _kube().update_status(body.meta.namespace or "", body.meta.name or "", lambda st, _tj: {
        **st, "conditions": b.set_condition(st.get("conditions"), "TemplateApplied", False,
                                            "JobTemplateImmutable", message, now, generation)})
    kopf.warn(body, reason="JobTemplateImmutable", message=message)


@kopf.on.update(*RESOURCE, field="spec.throttle.inject")
def inject_changed(body: kopf.Body, old: Any, new: Any, **_: Any) -> None:
    """`inject` shapes the pod template, which a created Job cannot change."""
    job = (body.status or {}).get("jobName")
    if not job or (old or b.DEFAULT_INJECT) == (new or b.DEFAULT_INJECT):
        return  # no Job yet: the create path (policy_changed -> ensure) reads it
    message = (f"throttle.inject changed to {new or b.DEFAULT_INJECT}, but Job {job} is "
               "already created and its pod template is immutable; it applies to the next "
               "Job (delete and re-create the ThrottledJob)")
    now, generation = b.now_iso(), body.meta.get("generation")
    _kube().update_status(body.meta.namespace or "", body.meta.name or "", lambda st, _tj: {
        **st, "conditions": b.set_condition(st.get("conditions"), "TemplateApplied", False,
                                            "InjectImmutable", message, now, generation)})
    kopf.warn(body, reason="InjectImmutable", message=message)


@kopf.on.event("batch", "v1", "jobs", labels={b.LABEL_NAME: kopf.PRESENT})
def job_event(body: kopf.Body, type: str | None, namespace: str | None,
              logger: logging.Logger, **_: Any) -> None:
    """The Job controller's view (active, conditions, times) -> phase and conditions."""
    owner = b.job_owner_name(body)
    if owner is None or type == "DELETED" or namespace is None:
        return
    now = b.now_iso()
    try:
        result = _kube().update_status(
            namespace, owner, lambda st, _tj: b.status_from_job(st, body.get("status"), now))
    except ApiError as e:
        logger.warning("cannot update %s/%s from its Job: %s", namespace, owner, e)
        return
    if result and result[1].get("phase") != result[2].get("phase"):
        tj, _old, new = result
        phase = new.get("phase")
        post = kopf.warn if phase == "Failed" else kopf.info
        post(tj, reason=f"Job{phase}", message=f"Job {body.get('metadata', {}).get('name')} "
                                                f"is {phase}")


@kopf.timer(*RESOURCE, interval=SETTINGS.status_interval_seconds,
            when=lambda status, **_: status.get("phase") == "Running")
def read_sidecars(name: str | None, namespace: str | None, **_: Any) -> None:
    """Observed peaks from each running pod's sidecar /status into status.observed."""
    if name is None or namespace is None:
        return
    kube, reader = _kube(), RUNTIME.reader
    assert reader is not None
    reports: list[dict[str, Any]] = []
    failures: list[str] = []
    try:
        pods = kube.list_pods(namespace, f"{b.LABEL_NAME}={name}")
    except ApiError as e:
        raise kopf.TemporaryError(str(e), delay=5) from e
    for pod in pods:
        # Filter here too: a selector the server ignores must not mix ThrottledJobs.
        if (pod.get("metadata", {}).get("labels") or {}).get(b.LABEL_NAME) != name:
            continue
        endpoint = b.sidecar_endpoint(pod)
        if endpoint is None:
            continue
        try:
            reports.append(reader.read(*endpoint))
        except StatusReadError as e:
            failures.append(f"pod {pod['metadata'].get('name')}: {e}")
    now = b.now_iso()
    result = kube.update_status(namespace, name, lambda st, _tj: b.status_with_observed(
        st, reports, failures, now))
    if result:
        tj, old, new = result
        was, is_ = b.condition(old, "TargetMet") or {}, b.condition(new, "TargetMet") or {}
        if is_.get("reason") == "BudgetExhausted" and was.get("reason") != "BudgetExhausted":
            kopf.warn(tj, reason="TargetUnreachable", message=is_.get("message", ""))
