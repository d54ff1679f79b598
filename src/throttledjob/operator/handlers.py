"""The kopf handlers: each one reads, calls a pure function, and writes.

Every event about a ThrottledJob (its spec, its child) and every tick of the poller
(poller.py) leads to one pass of reconcile.py, the one writer of its children, pods'
limits and status. Importing this module registers them. What they share (settings, the
API client, what the watch has shown) is an OperatorState in kopf's memo, made once by
the startup handler.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import threading
from typing import Any

import kopf

from . import admission, child, metrics
from .api_names import GROUP, PLURAL, VERSION
from .attach import attached, labeled
from .budget_crd import BUDGET_PLURAL
from .budget_pass import (
    budget_pass,
    forget_budget,
    remember_suspended,
    settle_new_member,
    split_for_new_member,
)
from .children import LABEL_NAME, owner_reference
from .config import OperatorSettings
from .kube import ApiError, Kube
from .login import LoginError, connection_info
from .poller import POLL_THREADS, poll
from .reconcile import child_pass, spec_pass
from .sidecar_status import HttpStatusReader
from .state import OperatorState

RESOURCE = (GROUP, VERSION, PLURAL)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: logging.Logger,
              **_: Any) -> None:
    """Read our settings (the environment, then the command line's flags, which main.py
    puts in memo.overrides), log in, and start the poller."""
    ours = dataclasses.replace(OperatorSettings.from_env(), **memo.get("overrides", {}))
    # Keep kopf's progress and diff-base in annotations, not in status: the status schema
    # is strict (no x-kubernetes-preserve-unknown-fields), so status.kopf would be pruned.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    # kopf waits this long for the watch to show its own annotation patch before it
    # handles the object's next event; past it, it takes that event (our status patch)
    # for one of an object not yet handled and runs the create handler again. Under a
    # burst of 1,000 the watch lagged past the default 5 s for about 3 objects in 4
    # (2,272 create runs for 1,300 ThrottledJobs: bench/operator_load.py).
    settings.persistence.consistency_timeout = 60.0
    # No finalizer: children go by ownerReferences, so deleting a ThrottledJob never
    # waits for the operator (kopf adds one only for deletion handlers; there are none).
    # kopf's own log lines are no Events (events.py); warnings and errors are.
    settings.posting.level = logging.WARNING
    # Handlers are sync and block on API calls: with the default pool (6 threads on 2
    # cores) a burst of 1,000 queued behind each other's round trips (bench/operator_load.py).
    settings.execution.max_workers = ours.handler_threads
    # A watch that silently stalls (a proxy, a dead connection) is restarted.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    try:
        kube = Kube(connection_info, ours.handler_threads + POLL_THREADS,  # one per thread
                    timeout_seconds=ours.api_timeout_seconds)
    except (LoginError, OSError, ValueError) as e:
        # Retrying cannot conjure a kubeconfig: stop with the reason instead.
        raise kopf.PermanentError(f"cannot find the cluster (in-cluster service account, "
                                  f"KUBECONFIG or ~/.kube/config): {e}") from e
    memo.state = OperatorState(ours, kube, HttpStatusReader(ours.status_timeout_seconds))
    # Before any watch: a member's pass must not resume what a budget keeps suspended.
    remember_suspended(memo.state, memo.get("namespaces") or [], logger)
    if ours.metrics_port:
        try:
            metrics.serve(ours.metrics_port, lambda: memo.state.seen,
                          fleet=lambda: memo.state.fleet)
        except OSError as e:
            raise kopf.PermanentError(f"cannot serve metrics on port {ours.metrics_port}: "
                                      f"{e.strerror or e}") from e
    if ours.webhook_port:
        _serve_webhook(memo.state, logger)
    threading.Thread(target=poll, args=(memo.state, logger), name="throttledjob-poller",
                     daemon=True).start()
    logger.info("sidecar image %s, status every %gs", ours.sidecar_image,
                ours.status_interval_seconds)


def _serve_webhook(state: OperatorState, logger: logging.Logger) -> None:
    """Attach mode's webhook (admission.py). Where it cannot start, the operator runs on
    without it: template mode needs none, and an attached ThrottledJob says which of its
    pods started unthrottled (the configuration's failurePolicy is Ignore)."""
    ours = state.settings
    try:
        webhook_kube = Kube(connection_info, 8, timeout_seconds=admission.API_TIMEOUT_SECONDS,
                            attempts=1)
        admission.serve(ours, state.kube, webhook_kube, state.stop, state.fleet)
    except (ApiError, LoginError, OSError, ValueError) as e:
        logger.error("the admission webhook is not served (port %d): %s; attached "
                     "ThrottledJobs' new pods start unthrottled", ours.webhook_port, e)
        return
    logger.info("admission webhook on port %d", ours.webhook_port)


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """kopf's watches log in as our own calls do (login.py), and again after a 401."""
    return connection_info()


@kopf.on.cleanup()
def stop_poller(memo: kopf.Memo, **_: Any) -> None:
    state = memo.get("state")
    if state is not None:
        state.stop.set()


def _state(memo: kopf.Memo) -> OperatorState:
    state = memo.get("state")
    assert isinstance(state, OperatorState), "the startup handler did not run"
    return state


def _retry_later(e: ApiError, retry: int) -> kopf.TemporaryError:
    """The API failed even after Kube's own retries: kopf runs the handler again later,
    backing off (1, 2, 4, ... 60 s); every handler is idempotent."""
    return kopf.TemporaryError(str(e), delay=min(60, 2 ** min(retry, 6)))


@kopf.on.resume(*RESOURCE)
@kopf.on.create(*RESOURCE)
@kopf.on.update(*RESOURCE, field="spec")
def reconcile(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, retry: int = 0,
              **_: Any) -> None:
    """Created, resumed or any edit of the spec: one pass (reconcile.py); before its Job
    is made, the budgets of its namespace split with it, and after, its policy is held to
    the share it has by then (budget_pass.py)."""
    try:
        state = _state(memo)
        new = not (body.status or {}).get("jobName")
        if new:
            split_for_new_member(state, body.meta.namespace or "")
        spec_pass(body, state, logger)
        if new:
            settle_new_member(state, body.meta.namespace or "", body.meta.name or "")
    except ApiError as e:
        raise _retry_later(e, retry) from e


@kopf.on.event("batch", "v1", "jobs", labels={LABEL_NAME: kopf.PRESENT})
def job_event(body: kopf.Body, memo: kopf.Memo, type: str | None, namespace: str | None,
              logger: logging.Logger, **_: Any) -> None:
    """The Job's or JobSet's controller's view (active, conditions, times) -> phase and
    conditions (a JobSet read as a Job: child.as_job). JobSets are watched only with the
    operator's JobSet support on (below); kopf serves that watch where JobSet is
    installed, and starts it when it is."""
    state = _state(memo)
    ref = owner_reference(body) or {}
    owner = ref.get("name")
    if owner is None or namespace is None:
        return
    key, uid = (namespace, owner), body.meta.uid or ""
    if type == "DELETED" and state.job_uids.get(key) == uid:
        del state.job_uids[key]
    try:   # a Job deleted before it finished fails the ThrottledJob (status_job_gone)
        deleted = type == "DELETED"
        ours = child_pass(state, namespace, owner, body, ref.get("uid"), deleted)
        if ours and not deleted:
            state.job_uids[key] = uid
    except ApiError as e:
        # Event handlers are not retried by kopf; the poller's resync catches up.
        logger.warning("cannot update %s/%s from its Job: %s", namespace, owner, e)


# Registered when the handlers are imported, from the environment the startup handler
# reads too: kopf decides what to watch from its registry.
if OperatorSettings.from_env().jobsets:
    kopf.on.event("jobset.x-k8s.io", "v1alpha2", "jobsets",
                  labels={LABEL_NAME: kopf.PRESENT})(job_event)


@kopf.on.event(*RESOURCE)
def track(body: kopf.Body, memo: kopf.Memo, type: str | None, **_: Any) -> None:
    """What the poller walks: each ThrottledJob's phase and Job, as the watch shows them."""
    state = _state(memo)
    key = (body.meta.namespace or "", body.meta.name or "")
    if state.context is None:
        state.context = contextvars.copy_context()
    if type == "DELETED":
        state.seen.pop(key, None)
        state.limits.forget(key)
        state.jobsets.discard(key)
        state.attached.discard(key)
        state.labeled.discard(key)
        state.fleet.forget(key)
    else:
        if child.is_jobset(body.get("spec") or {}):
            state.jobsets.add(key)
        if attached(body.get("spec") or {}):
            state.attached.add(key)
        if labeled(body.get("spec") or {}):
            state.labeled.add(key)
        st = body.get("status") or {}
        state.seen[key] = (st.get("phase"), st.get("jobName"))


@kopf.on.event(GROUP, VERSION, BUDGET_PLURAL)
def track_budget(body: kopf.Body, memo: kopf.Memo, type: str | None, logger: logging.Logger,
                 **_: Any) -> None:
    """The ThrottleBudgets the poller splits; a spec not yet acted on (a signal patched
    in, a lower peak) is split now, not at the next tick; one deleted frees its members."""
    state = _state(memo)
    key = (body.meta.namespace or "", body.meta.name or "")
    try:
        if type == "DELETED":
            state.budgets.discard(key)
            forget_budget(state, *key)
            return
        state.budgets.add(key)
        if (body.status or {}).get("observedGeneration") != body.meta.get("generation"):
            budget_pass(state, *key)
    except ApiError as e:  # event handlers are not retried: the poller's next tick is
        logger.warning("ThrottleBudget %s/%s: %s", *key, e)
