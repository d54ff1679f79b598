"""What one reconcile pass writes, decided from the ThrottledJob, its policy (parsed once
per pass) and what the pass saw (observe.Seen). Pure: the children's patches, the next
status, and the events that say what changed, in; nothing touches the API here.

`decide` gives the children's writes and the conditions the spec's checks set;
`next_status` the status from those and from what was seen, applied to the status as
read at the write (so a write retried after a conflict starts again from the fresh
one); `events_after` the events for a write that happened, from its old and new status.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from throttledjob.contracts.policy import parse_policy

from . import child
from .api_names import INJECT_MODES
from .attach import attached, labeled
from .children import TEMPLATE_HASH, build_configmap, template_hash
from .conditions import (
    GONE_REASONS,
    Condition,
    Phase,
    Reason,
    at_generation,
    condition,
    set_condition,
    status_from_job,
    status_job_gone,
    status_with_admission,
)
from .job_split import Rank, job_scoped
from .kueue import active_patch, queued_by_kueue
from .observe import Seen
from .observed import status_with_observed, status_with_split
from .pod_conditions import status_with_resizes, status_with_stuck
from .pod_limits import job_ranks
from .quota import kernel_target
from .validation import SpecError

FINISHED = (Phase.SUCCEEDED, Phase.FAILED)
Policy = Mapping[str, Any] | SpecError  # the spec's policy document, or why it is refused


@dataclass(frozen=True)
class Said:
    """A condition this pass sets, and the warning that says it when it changes."""

    type: Condition
    ok: bool
    reason: str
    message: str
    warning: str | None = None


@dataclass(frozen=True)
class Event:
    reason: str
    message: str
    warning: bool = False


@dataclass
class Writes:
    """What one pass does, in the order reconcile.apply makes it."""

    create_config_map: dict[str, Any] | None = None
    config_map_data: dict[str, str] | None = None  # patched onto the existing ConfigMap
    child_patch: dict[str, Any] | None = None  # spec.suspend, onto the Job or JobSet
    workload_patch: dict[str, Any] | None = None  # spec.active, onto Kueue's Workload
    generation: int | None = None  # acted on: status.observedGeneration (spec passes)
    said: list[Said] = field(default_factory=list)
    split: list[Rank] = field(default_factory=list)  # scope Job: the ranks, for the status
    events: list[Event] = field(default_factory=list)  # Normal, for the children's writes
    target: float | None = None  # the CPU target the pods' limits hold (quota.py)
    resize: bool = False  # the running pods' limits to a new target, now
    lift: bool = True  # a sidecar may have its pod's limit lifted past the target (Soft)


def decide(tj: Mapping[str, Any], policy: Policy, seen: Seen,
           suspended_by: str | None = None) -> Writes:
    """The writes that bring a made ThrottledJob's children to its spec; `suspended_by`:
    a ThrottleBudget that keeps it suspended (fleet_split.to_suspend), as spec.suspend."""
    spec, status = tj.get("spec") or {}, tj.get("status") or {}
    out = Writes(target=cpu_target(spec, policy), lift=not held_hard(policy))
    current = seen.child.obj if seen.child else None
    if seen.readings is not None and job_scoped(spec):
        r = seen.readings
        out.split = job_ranks(spec, r.pods, r.reports, r.held)
    if seen.readings is not None and seen.readings.unthrottled is not None:
        out.said.append(throttled_said(seen.readings.unthrottled))
    if seen.for_spec:
        out.generation = (tj.get("metadata") or {}).get("generation")
    if labeled(spec):  # no one workload: the policy alone
        if seen.for_spec:
            _decide_policy(tj, policy, seen, out)
        return out
    if current is None or status.get("phase") in FINISHED:
        return out  # the child's status says it all
    if attached(spec):
        # The workload is its maker's: its suspend and its Workload are theirs to set.
        if seen.for_spec:
            _decide_policy(tj, policy, seen, out)
        return out
    suspend = bool(spec.get("suspend")) or suspended_by is not None
    why = ("resumed" if not suspend else "suspended (spec.suspend)" if spec.get("suspend")
           else f"suspended (ThrottleBudget {suspended_by}: the members' floors pass it)")
    if seen.workload is not None and seen.workload.obj is not None:
        # Held to spec.suspend on every look: Kueue makes a Workload anew active.
        out.workload_patch = active_patch(seen.workload.obj, suspend)
    if not seen.for_spec:
        return out
    _decide_policy(tj, policy, seen, out)
    _decide_template(spec, current, out)
    if not queued_by_kueue(current) and \
            bool((current.get("spec") or {}).get("suspend")) != suspend:
        out.child_patch = {"spec": {"suspend": suspend}}
    if out.workload_patch or out.child_patch:
        out.events.append(Event(Reason.SUSPEND_REQUESTED if suspend else Reason.RESUMED,
                                f"Job {current['metadata']['name']} {why}"))
    return out


def throttled_said(unthrottled: list[str]) -> Said:
    """PodsThrottled, attach mode: which of the workload's pods run without the throttle,
    and what to do (a pod cannot gain a sidecar once made)."""
    if not unthrottled:
        return Said(Condition.PODS_THROTTLED, True, Reason.ALL_PODS_THROTTLED,
                    "every running pod of the workload has the throttle")
    shown = ", ".join(unthrottled[:5]) + (f" and {len(unthrottled) - 5} more"
                                          if len(unthrottled) > 5 else "")
    message = (f"{len(unthrottled)} pod(s) run without the throttle: {shown} (made before "
               "the ThrottledJob, or while the admission webhook was not answering); a pod "
               "cannot gain it once made: delete them to have them made anew throttled")
    return Said(Condition.PODS_THROTTLED, False, Reason.PODS_NOT_THROTTLED, message,
                warning=message)


def cpu_target(spec: Mapping[str, Any], policy: Policy) -> float | None:
    """The CPU target the pods' limits hold (job-wide under scope Job); None where the
    kernel's quota does not enforce it, or the policy is refused (the pods keep theirs)."""
    return None if isinstance(policy, SpecError) else kernel_target(spec, policy)


def held_hard(policy: Policy) -> bool:
    """Whether the policy holds its targets Hard: no lift past them, whatever a sidecar
    asks (one whose ConfigMap has not reached it yet may still ask)."""
    return not isinstance(policy, SpecError) and parse_policy(dict(policy)).hard


def _decide_policy(tj: Mapping[str, Any], policy: Policy, seen: Seen, out: Writes) -> None:
    if isinstance(policy, SpecError):
        out.said.append(Said(Condition.POLICY_APPLIED, False, policy.reason, str(policy),
                             warning=f"policy edit not applied: {policy}"))
        return
    cm = build_configmap(tj["metadata"]["name"], tj.get("spec") or {}, policy)
    existing = seen.config_map.obj if seen.config_map else None
    if existing is None:
        out.create_config_map = cm  # gone while the Job runs: its new pods mount it
    elif (existing.get("data") or {}) != cm["data"]:
        out.config_map_data, out.resize = cm["data"], True
        out.events.append(Event(Reason.POLICY_UPDATED, f"Updated ConfigMap "
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


def next_status(status: dict[str, Any], tj: Mapping[str, Any], seen: Seen, writes: Writes,
                now: str) -> dict[str, Any]:
    """The status after this pass, from `status` as read at the write and `tj` as read
    with it: the child's phase and conditions, Kueue's admission, the sidecars' readings
    and the spec's conditions, each where this pass looked at it."""
    out = dict(status)
    if seen.child is not None:
        current, job = seen.child.obj, seen.child.name
        if current is not None:
            out = status_from_job(out, child.as_job(current), tj, now)
        if (current is None or seen.deleted) and \
                not (tj.get("metadata") or {}).get("deletionTimestamp"):
            out = status_job_gone(out, job, now, seen.deleted)
    if seen.workload is not None and out.get("phase") in (Phase.QUEUED, Phase.SUSPENDED):
        out = status_with_admission(out, seen.workload.obj, tj, now)
    if seen.readings is not None:
        r = seen.readings
        out = status_with_stuck(status_with_resizes(status_with_observed(
            out, list(r.reports.values()), r.failures, now), r.pending, now), r.stuck, now)
        if writes.split:
            out = status_with_split(out, writes.target or 0.0, writes.split, now)
    if writes.generation is not None:
        out = at_generation(out, writes.generation)
    for said in writes.said:
        out["conditions"] = set_condition(out.get("conditions"), said.type, said.ok,
                                          said.reason, said.message, now, writes.generation)
    return out


def events_after(old: Mapping[str, Any], new: Mapping[str, Any], writes: Writes,
                 kind: str) -> list[Event]:
    """The events of a status write from `old` to `new`: the children's writes (Normal),
    the phase moved, and a warning where a condition that needs one changed to it."""
    out = list(writes.events)
    if old.get("phase") != new.get("phase") and new.get("phase"):
        phase = new["phase"]
        failed = condition(new, Condition.FAILED) or {}
        if phase == Phase.FAILED and failed.get("reason") in GONE_REASONS:
            out.append(Event(failed["reason"], failed.get("message", ""), warning=True))
        else:
            out.append(Event(f"Job{phase}", f"{kind} {new.get('jobName')} is {phase}",
                             warning=phase == Phase.FAILED))
    met = condition(new, Condition.TARGET_MET) or {}
    if met.get("reason") == Reason.BUDGET_EXHAUSTED and \
            (condition(old, Condition.TARGET_MET) or {}).get("reason") != met["reason"]:
        out.append(Event(Reason.TARGET_UNREACHABLE, met.get("message", ""), warning=True))
    started = condition(new, Condition.PODS_STARTED) or {}
    if started.get("status") == "False" and \
            (condition(old, Condition.PODS_STARTED) or {}).get("status") != "False":
        out.append(Event(Reason.POD_CANNOT_START, started.get("message", ""), warning=True))
    for said in writes.said:
        if said.warning and _changed(old, new, said.type):
            out.append(Event(said.reason, said.warning, warning=True))
    return out


def _changed(old: Mapping[str, Any], new: Mapping[str, Any], type_: str) -> bool:
    def key(st: Mapping[str, Any]) -> tuple[Any, ...]:
        c = condition(st, type_) or {}
        return c.get("status"), c.get("reason"), c.get("message")
    return key(old) != key(new)
