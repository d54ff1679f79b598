"""One pass over a ThrottledJob: observe, decide, apply.

Every event about a ThrottledJob's spec (created, resumed after a restart, any edit)
lands here (handlers.reconcile). Before its child is made, the pass makes it
(create.py). After, it compares what the spec asks with what the API shows (the
ConfigMap's policy, the hash of the template the child was made from, the child's or
its Kueue Workload's suspend, the child's own status), never what changed, so it is safe
to run again at any point: a pass stopped between two writes is finished by the next.

`decide` is pure: the spec, its policy (parsed once per pass), and what was seen, in;
the writes, out. `apply` makes them in one order: the children, then one status write,
then the events (only for what was written), then the pods' limits.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from . import child, events
from .children import TEMPLATE_HASH, build_configmap, configmap_name, template_hash
from .create import ensure_children
from .kube import Kube
from .kueue import active_patch, queued_by_kueue, workload_path
from .names import INJECT_MODES
from .poller import (
    OperatorState,
    from_job,
    get_child,
    post_phase_change,
    resize_to_new_target,
)
from .status import Condition, Phase, Reason, at_generation, now_iso, set_condition
from .validation import SpecError, validate

FINISHED = (Phase.SUCCEEDED, Phase.FAILED)


@dataclass(frozen=True)
class Seen:
    """What the API shows of a made ThrottledJob's children."""

    child: Mapping[str, Any] | None  # its Job or JobSet; None: gone
    config_map: Mapping[str, Any] | None
    workload: Mapping[str, Any] | None  # Kueue's Workload of the child, where Kueue queues it


@dataclass(frozen=True)
class Said:
    """A condition this pass sets, and the event that says it when it changes."""

    type: Condition
    ok: bool
    reason: str
    message: str
    warning: str | None = None  # the Warning event's message, posted where it changed


@dataclass
class Writes:
    """What one pass does, in the order `apply` makes it."""

    create_config_map: dict[str, Any] | None = None
    config_map_data: dict[str, str] | None = None  # patched onto the existing ConfigMap
    child_patch: dict[str, Any] | None = None  # spec.suspend, onto the Job or JobSet
    workload_patch: dict[str, Any] | None = None  # spec.active, onto Kueue's Workload
    said: list[Said] = field(default_factory=list)
    events: list[tuple[str, str]] = field(default_factory=list)  # Normal: (reason, message)
    resize: bool = False  # the running pods' limits to the new target, now


def decide(tj: Mapping[str, Any], policy: Mapping[str, Any] | SpecError,
           seen: Seen) -> Writes:
    """The writes that bring a made ThrottledJob's children to its spec. `policy`: the
    spec's policy document, or why the spec's policy is refused (the pods keep the last
    good one)."""
    spec, status = tj.get("spec") or {}, tj.get("status") or {}
    out = Writes()
    if seen.child is None or status.get("phase") in FINISHED:
        return out  # the child's status says it all (from_job)
    job = seen.child["metadata"]["name"]
    _decide_policy(tj, policy, seen, out)
    _decide_template(spec, seen.child, out)
    suspend = bool(spec.get("suspend"))
    if seen.workload is not None:
        out.workload_patch = active_patch(seen.workload, suspend)
    elif not queued_by_kueue(seen.child) and \
            bool((seen.child.get("spec") or {}).get("suspend")) != suspend:
        out.child_patch = {"spec": {"suspend": suspend}}
    if out.workload_patch or out.child_patch:
        out.events.append((Reason.SUSPEND_REQUESTED if suspend else Reason.RESUMED,
                           f"Job {job} {'suspended' if suspend else 'resumed'} "
                           "(spec.suspend)"))
    return out


def _decide_policy(tj: Mapping[str, Any], policy: Mapping[str, Any] | SpecError,
                   seen: Seen, out: Writes) -> None:
    if isinstance(policy, SpecError):
        out.said.append(Said(Condition.POLICY_APPLIED, False, policy.reason, str(policy),
                             warning=f"policy edit not applied: {policy}"))
        return
    cm = build_configmap(tj["metadata"]["name"], tj.get("spec") or {}, policy)
    if seen.config_map is None:
        out.create_config_map = cm  # gone while the Job runs: its new pods mount it
    elif (seen.config_map.get("data") or {}) != cm["data"]:
        out.config_map_data, out.resize = cm["data"], True
        out.events.append((Reason.POLICY_UPDATED, f"Updated ConfigMap "
                           f"{cm['metadata']['name']}; running pods apply it live"))
    out.said.append(Said(Condition.POLICY_APPLIED, True, Reason.CONFIG_MAP_UPDATED,
                         "the sidecar reads the new policy live"))


def _decide_template(spec: Mapping[str, Any], job: Mapping[str, Any], out: Writes) -> None:
    """TemplateApplied: whether the child was made from this template and inject (a Job's
    pod template is immutable: say so rather than restart it). A child made before its
    hash was kept on it is not judged."""
    made_from = ((job.get("metadata") or {}).get("annotations") or {}).get(TEMPLATE_HASH)
    name, kind = job["metadata"]["name"], job.get("kind", "Job")
    if made_from is None:
        return
    if made_from == template_hash(spec):
        out.said.append(Said(Condition.TEMPLATE_APPLIED, True, Reason.TEMPLATE_MATCHES_JOB,
                             f"the template is the one {name} runs"))
        return
    throttle = spec.get("throttle") or {}
    inject = [m for m in INJECT_MODES
              if template_hash({**spec, "throttle": {**throttle, "inject": m}}) == made_from]
    if inject:  # only throttle.inject differs
        reason, message = Reason.INJECT_IMMUTABLE, (
            f"throttle.inject changed to {throttle.get('inject')}, but {kind} {name} is "
            "already created and its pod template is immutable; it applies to the next "
            "Job (delete and re-create the ThrottledJob)")
    else:
        reason, message = Reason.JOB_TEMPLATE_IMMUTABLE, (
            f"the template changed, but {kind} {name} is already created and its pod "
            "templates are immutable; delete and re-create the ThrottledJob to run the "
            "new template")
    out.said.append(Said(Condition.TEMPLATE_APPLIED, False, reason, message,
                         warning=message))


def reconcile(body: kopf.Body, state: OperatorState, logger: logging.Logger) -> None:
    """One pass over the ThrottledJob `body` (module doc)."""
    made = (body.status or {}).get("jobName")
    if not made:
        ensure_children(body, state, logger)
        return
    ns = body.meta.namespace or ""
    try:
        policy: Mapping[str, Any] | SpecError = validate(
            body, state.settings.allow_host_access, state.settings.jobsets)
    except SpecError as e:
        policy = e
    seen = observe(state.kube, ns, made, child.is_jobset(body.spec), body.meta.name or "")
    apply(state, body, made, seen, decide(body, policy, seen))


def observe(kube: Kube, namespace: str, job: str, jobset: bool, name: str) -> Seen:
    current = get_child(kube, namespace, job, jobset)
    workload = None
    if current is not None and queued_by_kueue(current):
        workload = kube.workload_of(namespace, current["metadata"].get("uid", ""))
    return Seen(current, kube.get(f"/api/v1/namespaces/{namespace}/configmaps/"
                                  f"{configmap_name(name)}"), workload)


def apply(state: OperatorState, body: kopf.Body, job: str, seen: Seen,
          writes: Writes) -> None:
    kube, ns, name = state.kube, body.meta.namespace or "", body.meta.name or ""
    cm_path = f"/api/v1/namespaces/{ns}/configmaps"
    if writes.create_config_map is not None:
        kopf.adopt(writes.create_config_map, owner=body)
        kube.create(cm_path, writes.create_config_map)
    if writes.config_map_data is not None:
        kube.merge_patch(f"{cm_path}/{configmap_name(name)}",
                         {"data": writes.config_map_data})
    if writes.child_patch is not None:
        kube.merge_patch(child.path(ns, job, child.is_jobset(body.spec)), writes.child_patch)
    if writes.workload_patch is not None and seen.workload is not None:
        kube.merge_patch(workload_path(seen.workload), writes.workload_patch)
    now, generation = now_iso(), body.meta.get("generation")
    job_status = from_job(job, seen.child, now)

    def mutate(st: dict[str, Any], tj: Mapping[str, Any]) -> dict[str, Any]:
        out = at_generation(job_status(st, tj), generation)
        for said in writes.said:
            out["conditions"] = set_condition(out.get("conditions"), said.type, said.ok,
                                              said.reason, said.message, now, generation)
        return out

    result = kube.update_status(ns, name, mutate)
    if result is None:
        return
    post_phase_change(result, job, seen.child)
    for reason, message in writes.events:
        events.normal(body, reason=reason, message=message)
    _, old, new = result
    for said in writes.said:
        if said.warning and _changed(old, new, said.type):
            kopf.warn(body, reason=said.reason, message=said.warning)
    if writes.resize:
        # Enforcement Quota: the running pods' limits to the new target now. A refused
        # resize leaves the old limits: the sidecar then holds a lower target with
        # signals, a higher one stays at the old limit.
        resize_to_new_target(state, result[0])


def _changed(old: Mapping[str, Any], new: Mapping[str, Any], type_: str) -> bool:
    def key(st: Mapping[str, Any]) -> tuple[Any, ...]:
        c = next((c for c in st.get("conditions") or [] if c.get("type") == type_), {})
        return c.get("status"), c.get("reason"), c.get("message")
    return key(old) != key(new)
