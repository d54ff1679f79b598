"""The kopf handlers: each one reads, calls a builder, and writes.

Every decision lives in builders.py (pure, unit tested); these functions only move
objects between kopf, the builders and the API. Importing this module registers them.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
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
    # (namespace, name) -> (phase, jobName) of every ThrottledJob the watch has shown.
    seen: dict[tuple[str, str], tuple[str | None, str | None]] = field(default_factory=dict)
    # (namespace, ThrottledJob name) -> uid of its Job, as the Job watch showed it: only
    # pods that Job owns are ever read.
    job_uids: dict[tuple[str, str], str] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    context: contextvars.Context | None = None


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
    # Handlers are sync and block on API calls: with the default pool (6 threads on 2
    # cores) a burst of 1,000 queued behind each other's round trips (bench/operator_load.py).
    settings.execution.max_workers = SETTINGS.handler_threads
    # A watch that silently stalls (a proxy, a dead connection) is restarted.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    try:
        RUNTIME.kube = Kube(load_client(SETTINGS.handler_threads + 8),
                            timeout_seconds=SETTINGS.api_timeout_seconds)
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


def _retry_later(e: ApiError, retry: int) -> kopf.TemporaryError:
    """The API failed even after Kube's own retries: kopf runs the handler again later,
    backing off (1, 2, 4, ... 60 s); every handler is idempotent."""
    return kopf.TemporaryError(str(e), delay=min(60, 2 ** min(retry, 6)))


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
        doc = b.validate(body, SETTINGS.allow_host_access)
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
    current = kube.create(jobs_path, job)
    created = current is not None
    if current is None:
        current = kube.get(f"{jobs_path}/{job['metadata']['name']}") or {}
        if not b.owned_by(current, body.meta.uid or ""):
            _refuse(body, b.SpecError("JobNameTaken", f"Job {job['metadata']['name']} exists "
                                      "and is not owned by this ThrottledJob"), generation)
    now = b.now_iso()
    # The phase comes from the Job as it is now: after a restart the Job may be running
    # or finished already, and its events may have been handled before this.
    kube.update_status(ns, name, lambda st, _tj: b.status_from_job(b.status_job_created(
        st, job["metadata"]["name"], generation, now), current.get("status"), now))
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
def ensure(body: kopf.Body, logger: logging.Logger, retry: int = 0, **_: Any) -> None:
    try:
        _ensure(body, logger)
    except ApiError as e:
        raise _retry_later(e, retry) from e


@kopf.on.update(*RESOURCE, field="spec.throttle")
@kopf.on.update(*RESOURCE, field="spec.parameters")
def policy_changed(body: kopf.Body, logger: logging.Logger, retry: int = 0,
                   **_: Any) -> None:
    """A live edit: rewrite the ConfigMap; the kubelet projects it into the running pod."""
    kube, generation = _kube(), body.meta.get("generation")
    if not (body.status or {}).get("jobName"):
        return ensure(body=body, logger=logger, retry=retry)  # refused before: maybe fixed
    try:
        doc = b.validate(body, SETTINGS.allow_host_access)
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
        raise _retry_later(e, retry) from e
    kopf.info(body, reason="PolicyUpdated",
              message=f"Updated ConfigMap {cm['metadata']['name']}; running pods apply it live")


@kopf.on.update(*RESOURCE, field="spec.jobTemplate")
def template_changed(body: kopf.Body, logger: logging.Logger, retry: int = 0,
                     **_: Any) -> None:
    """A Job's pod template is immutable: say so instead of silently restarting."""
    job = (body.status or {}).get("jobName")
    if not job:
        return ensure(body=body, logger=logger, retry=retry)
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
    if owner is None or namespace is None:
        return
    if type == "DELETED":
        RUNTIME.job_uids.pop((namespace, owner), None)
        return
    RUNTIME.job_uids[(namespace, owner)] = body.meta.uid or ""
    now = b.now_iso()
    try:
        result = _kube().update_status(
            namespace, owner, lambda st, _tj: b.status_from_job(st, body.get("status"), now))
    except ApiError as e:
        # Event handlers are not retried by kopf; the resync timer catches up.
        logger.warning("cannot update %s/%s from its Job: %s", namespace, owner, e)
        return
    if result and result[1].get("phase") != result[2].get("phase"):
        tj, _old, new = result
        phase = new.get("phase")
        post = kopf.warn if phase == "Failed" else kopf.info
        post(tj, reason=f"Job{phase}", message=f"Job {body.get('metadata', {}).get('name')} "
                                                f"is {phase}")


# --- periodic work, without kopf timers -------------------------------------------------
# kopf puts a finalizer on every object that has a timer or daemon, so a ThrottledJob could
# not be deleted while the operator is down. One thread instead walks the ThrottledJobs
# this process has seen (kopf's watch feeds `track`, within the operator's namespaces).

@kopf.on.event(*RESOURCE)
def track(body: kopf.Body, type: str | None, **_: Any) -> None:
    key = (body.meta.namespace or "", body.meta.name or "")
    if RUNTIME.context is None:
        # kopf.info/warn find kopf's event queue in context variables, set for handlers
        # (not yet for startup activities): the poller's threads run in a copy of these.
        RUNTIME.context = contextvars.copy_context()
    if type == "DELETED":
        RUNTIME.seen.pop(key, None)
    else:
        st = body.get("status") or {}
        RUNTIME.seen[key] = (st.get("phase"), st.get("jobName"))


@kopf.on.startup()
def start_poller(logger: logging.Logger, **_: Any) -> None:
    RUNTIME.stop.clear()
    threading.Thread(target=_poll, args=(logger,), name="throttledjob-poller",
                     daemon=True).start()


@kopf.on.cleanup()
def stop_poller(**_: Any) -> None:
    RUNTIME.stop.set()


def _poll(logger: logging.Logger) -> None:
    """Every status interval: the sidecars of Running ThrottledJobs. Every resync interval:
    the Job of each unfinished one (events lost to an API failure or a restart)."""
    next_resync = time.monotonic() + SETTINGS.resync_seconds
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="throttledjob-read") as pool:
        while not RUNTIME.stop.wait(SETTINGS.status_interval_seconds):
            seen = list(RUNTIME.seen.items())
            work = [(read_sidecars, ns, name, job) for (ns, name), (phase, job) in seen
                    if phase == "Running"]
            if time.monotonic() >= next_resync:
                next_resync = time.monotonic() + SETTINGS.resync_seconds
                work += [(resync_from_job, ns, name, job) for (ns, name), (phase, job) in seen
                         if job and phase not in ("Succeeded", "Failed")]
            context = RUNTIME.context or contextvars.copy_context()
            errors = pool.map(lambda w, c=context: c.copy().run(_safely, *w), work)
            for (fn, ns, name, _), error in zip(work, errors, strict=True):
                if error:
                    logger.warning("%s %s/%s: %s", fn.__name__, ns, name, error)


def _safely(fn: Any, namespace: str, name: str, job: str | None) -> str | None:
    try:
        fn(namespace, name, job)
    except Exception as e:  # the next tick tries again; the thread must live on
        return str(e) or type(e).__name__
    return None


def resync_from_job(namespace: str, name: str, job_name: str | None) -> None:
    """Level-triggered: the Job as it is now -> phase and conditions."""
    if not job_name:
        return
    kube = _kube()
    job = kube.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{job_name}")
    if job is None:
        return
    now = b.now_iso()
    kube.update_status(namespace, name,
                       lambda st, _tj: b.status_from_job(st, job.get("status"), now))


def read_sidecars(namespace: str, name: str, job: str | None = None) -> None:
    """Observed peaks from each running pod's sidecar /status into status.observed."""
    kube, reader = _kube(), RUNTIME.reader
    assert reader is not None
    job_uid = RUNTIME.job_uids.get((namespace, name))
    if not job_uid and job:
        current = kube.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{job}") or {}
        if b.job_owner_name(current) == name:
            job_uid = RUNTIME.job_uids[(namespace, name)] = current["metadata"]["uid"]
    if not job_uid:
        return
    reports: list[dict[str, Any]] = []
    failures: list[str] = []
    pods = kube.list_pods(namespace, f"{b.LABEL_NAME}={name}")
    for pod in pods:
        # Only the Job's own pods: anyone may put the label on a pod of theirs, whose
        # "sidecar" would then write our status (or stall our reads).
        if not b.owned_by(pod, job_uid):
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
