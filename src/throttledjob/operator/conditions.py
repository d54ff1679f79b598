"""A ThrottledJob's status: its phase and conditions from the operator's own steps, the
Job's status; what the sidecars read is observed.py's, and what the pods say
pod_conditions.py's.

Pure functions from the old status to the new one; the handlers write the result with a
resourceVersion precondition (Kube.update_status), so each may run again on a conflict.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from throttledjob.contracts.policy import Choice

from .kueue import admission, queued_by_kueue
from .validation import Refusal


class Phase(Choice):
    PENDING = "Pending"
    QUEUED = "Queued"        # Kueue holds the Job suspended until its queue admits it
    SUSPENDED = "Suspended"  # spec.suspend (or the Job's own) holds it
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class Condition(Choice):
    """The types of status.conditions (Complete and Failed mirror the Job's)."""

    READY = "Ready"
    FAILED = "Failed"
    COMPLETE = "Complete"
    THROTTLING = "Throttling"
    TARGET_MET = "TargetMet"
    POLICY_APPLIED = "PolicyApplied"
    TEMPLATE_APPLIED = "TemplateApplied"
    QUOTA_RESIZED = "QuotaResized"
    PODS_STARTED = "PodsStarted"  # False while a pod cannot start: its image (pod_conditions.py)
    SUSPENDED = "Suspended"
    ADMITTED = "Admitted"  # Kueue's admission, where Kueue queues the Job (kueue.py)
    # Attach mode (attach.py): False while a pod of the workload runs without the throttle.
    PODS_THROTTLED = "PodsThrottled"


class Reason(Choice):
    """Reasons of the conditions the operator writes, and of its events. A refused spec's
    reason is a validation.Refusal; a failed Job's is the Job controller's."""

    JOB_CREATED = "JobCreated"  # Ready; also the event
    ATTACHED = "Attached"  # Ready, attach mode; also the event
    WORKLOAD_NOT_FOUND = "WorkloadNotFound"  # Ready False: the workloadRef is not there yet
    ALL_PODS_THROTTLED = "AllPodsThrottled"  # PodsThrottled True
    PODS_NOT_THROTTLED = "PodsNotThrottled"  # PodsThrottled False; also the event
    SPEC_ACCEPTED = "SpecAccepted"  # Failed False: a refused spec was fixed
    JOB_COMPLETE = "JobComplete"
    JOB_FAILED = "JobFailed"  # a failed Job that gave no reason
    BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"  # the Job controller's
    THROTTLING = "Throttling"
    UNDER_TARGET = "UnderTarget"
    NOT_RUNNING = "NotRunning"
    TARGET_MET = "TargetMet"
    BUDGET_EXHAUSTED = "BudgetExhausted"
    CONVERGING = "Converging"
    NOT_MEASURED = "NotMeasured"  # TargetMet Unknown: a target has no sample yet
    CONFIG_MAP_UPDATED = "ConfigMapUpdated"  # PolicyApplied True
    JOB_TEMPLATE_IMMUTABLE = "JobTemplateImmutable"  # TemplateApplied False; also the event
    INJECT_IMMUTABLE = "InjectImmutable"  # TemplateApplied False; also the event
    TEMPLATE_MATCHES_JOB = "TemplateMatchesJob"  # TemplateApplied True: an edit reverted
    QUOTA_RESIZED = "QuotaResized"  # QuotaResized True; also the event of a resize
    STARTED = "Started"  # PodsStarted True (False: the kubelet's reason, ImagePullBackOff...)
    RESIZE_PENDING = "ResizePending"  # QuotaResized False
    SUSPEND_REQUESTED = "SuspendRequested"  # Suspended True: spec.suspend
    QUEUED = "Queued"  # Suspended True: Kueue holds the Job (Admitted has Kueue's reason)
    JOB_SUSPENDED = "JobSuspended"  # Suspended True: the Job's own spec.suspend
    RESUMED = "Resumed"  # Suspended False
    CHILD_KIND_MISSING = "JobSetNotInstalled"  # Ready False; also the event
    # Ready False: the Job or ConfigMap of a deleted ThrottledJob of the same name is still
    # there; retried.
    PREDECESSOR_PENDING = "WaitingForOldJob"
    # Ready False: the API server forbade the Job's create (a policy, a quota); retried.
    CHILD_FORBIDDEN = "JobForbidden"
    # Failed True, Ready False: the Job went before it finished; also the event.
    JOB_DELETED = "JobDeleted"
    # The same where its end was not seen (gone while the operator was not watching).
    JOB_GONE = "JobGone"
    # Events only.
    POLICY_UPDATED = "PolicyUpdated"
    SIGNALS_MAY_FAIL = "SignalsMayFail"
    QUOTA_UNAVAILABLE = "QuotaUnavailable"
    QUOTA_RESIZE_REFUSED = "QuotaResizeRefused"
    QUOTA_LIFTED = "QuotaLifted"  # the slowdown budget needs a limit over the target
    SPLIT_CHANGED = "SplitChanged"  # scope Job: the pods' parts of the target moved
    # TargetMet under scope Job: the kernel holds each pod at its limit.
    LIMITS_WITHIN_TARGET = "LimitsWithinTarget"
    LIMITS_OVER_TARGET = "LimitsOverTarget"
    TARGET_UNREACHABLE = "TargetUnreachable"
    POD_CANNOT_START = "PodCannotStart"


def now_iso(now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(conditions: list[dict[str, Any]] | None, type_: str, status: bool | None,
                  reason: str, message: str, now: str,
                  generation: int | None = None) -> list[dict[str, Any]]:
    """A new list with condition `type_` set (status None: Unknown); lastTransitionTime
    moves only on a flip."""
    out = [dict(c) for c in conditions or []]
    value = "Unknown" if status is None else "True" if status else "False"
    new = {"type": type_, "status": value, "reason": reason, "message": message[:32000],
           "lastTransitionTime": now}
    if generation is not None:
        new["observedGeneration"] = generation
    for i, c in enumerate(out):
        if c.get("type") == type_:
            if c.get("status") == value:
                new["lastTransitionTime"] = c.get("lastTransitionTime", now)
            out[i] = new
            return out
    out.append(new)
    return out


def at_generation(status: Mapping[str, Any], generation: int | None) -> dict[str, Any]:
    """`status` as of `generation`, acted on: status.observedGeneration, and each condition
    that carries one stamped with it too (each still says how the ThrottledJob stands at
    this generation). kubectl wait reads a condition's own observedGeneration first and a
    stale one as not met: after a live edit, `--for=condition=Ready` waited for good."""
    out = dict(status)
    out["observedGeneration"] = generation
    if generation is not None and out.get("conditions"):
        out["conditions"] = [{**c, "observedGeneration": generation}
                             if "observedGeneration" in c else dict(c)
                             for c in out["conditions"]]
    return out


def as_stored(obj: Any) -> Any:
    """`obj` as a merge patch of it leaves it stored: a member set to null is removed (in
    every nested object; a list is stored whole, nulls and all). A status that differs
    from the stored one only in such nulls is not a change: without this, a nullable
    figure that is null (no GPU) made every read a write."""
    if isinstance(obj, Mapping):
        return {k: as_stored(v) for k, v in obj.items() if v is not None}
    return obj


def condition(status: Mapping[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), None)


def status_invalid(status: Mapping[str, Any], reason: str, message: str,
                   generation: int | None, now: str) -> dict[str, Any]:
    """A refused spec: phase Failed, Ready False, Failed True with the reason (a
    validation.Refusal) and its message."""
    out = at_generation(status, generation)
    out["phase"] = Phase.FAILED
    conds = set_condition(out.get("conditions"), Condition.READY, False, reason, message,
                          now, generation)
    out["conditions"] = set_condition(conds, Condition.FAILED, True, reason, message, now,
                                      generation)
    return out


def status_job_created(status: Mapping[str, Any], job: str, generation: int | None,
                       now: str, reason: str = Reason.JOB_CREATED,
                       message: str | None = None) -> dict[str, Any]:
    """Ready: the child made (or, attach mode, found: `reason` and `message` say so)."""
    out = at_generation(status, generation)
    out["jobName"] = job
    if out.get("phase") in (None, Phase.FAILED) and not condition(status, Condition.COMPLETE):
        out["phase"] = Phase.PENDING
    conds = set_condition(out.get("conditions"), Condition.READY, True, reason,
                          message or f"Job {job} created with the throttle sidecar", now,
                          generation)
    failed = condition(status, Condition.FAILED)
    if failed and failed.get("reason") in set(Refusal):
        # A spec error that has been fixed; the Job's own failures are kept.
        conds = set_condition(conds, Condition.FAILED, False, Reason.SPEC_ACCEPTED,
                              "the spec is valid", now, generation)
    out["conditions"] = conds
    return out


def status_attached_by_label(status: Mapping[str, Any], message: str, generation: int | None,
                             now: str) -> dict[str, Any]:
    """Running and Ready (attach mode by label): a standing throttle, with no one workload
    whose phase it follows."""
    out = at_generation(status, generation)
    out["phase"] = Phase.RUNNING
    out["conditions"] = set_condition(out.get("conditions"), Condition.READY, True,
                                      Reason.ATTACHED, message, now, generation)
    return out


def status_waiting(status: Mapping[str, Any], reason: str, message: str,
                   generation: int | None, now: str) -> dict[str, Any]:
    """Pending, and Ready False with why (attach mode: the workload is not there yet)."""
    out = dict(status)
    out["phase"] = out.get("phase") or Phase.PENDING
    out["conditions"] = set_condition(out.get("conditions"), Condition.READY, False, reason,
                                      message, now, generation)
    return out


def status_from_job(status: Mapping[str, Any], job: Mapping[str, Any] | None,
                    tj: Mapping[str, Any], now: str) -> dict[str, Any]:
    """Phase, times and Complete/Failed from the Job, as the Job controller writes its
    status (conditions Complete/Failed, active/ready counters, start/completion); a
    suspended Job is Suspended where the ThrottledJob's `spec.suspend` (or the Job
    itself) holds it, Queued where Kueue does (kueue.py)."""
    js = (job or {}).get("status") or {}
    spec, generation = tj.get("spec") or {}, (tj.get("metadata") or {}).get("generation")
    out = dict(status)
    job_conds = {c.get("type"): c for c in js.get("conditions") or []
                 if c.get("status") == "True"}
    conds = list(status.get("conditions") or [])
    queued = queued_by_kueue(job or {})
    suspended = bool(((job or {}).get("spec") or {}).get("suspend"))
    if Condition.COMPLETE in job_conds:
        out["phase"] = Phase.SUCCEEDED
        conds = set_condition(conds, Condition.COMPLETE, True, Reason.JOB_COMPLETE,
                              job_conds[Condition.COMPLETE].get("message") or "the Job completed",
                              now)
        if (condition(status, Condition.FAILED) or {}).get("reason") in GONE_REASONS:
            # Taken for gone (a read that missed it), then seen to complete after all.
            for type_, ok in ((Condition.FAILED, False), (Condition.READY, True)):
                conds = set_condition(conds, type_, ok, Reason.JOB_COMPLETE,
                                      "the Job completed", now)
    elif Condition.FAILED in job_conds:
        out["phase"] = Phase.FAILED
        c = job_conds[Condition.FAILED]
        conds = set_condition(conds, Condition.FAILED, True, c.get("reason") or Reason.JOB_FAILED,
                              c.get("message") or "the Job failed", now)
    elif suspended:
        asked = bool(spec.get("suspend"))
        out["phase"] = Phase.QUEUED if queued and not asked else Phase.SUSPENDED
        reason, message = ((Reason.SUSPEND_REQUESTED, "spec.suspend is true") if asked
                           else (Reason.QUEUED, "Kueue holds the Job until its queue admits "
                                 "it (see the Admitted condition)") if queued
                           else (Reason.JOB_SUSPENDED, "the Job's spec.suspend is true"))
        conds = set_condition(conds, Condition.SUSPENDED, True, reason, message, now,
                              generation)
    elif js.get("active") or js.get("ready"):
        out["phase"] = Phase.RUNNING
    else:
        out["phase"] = Phase.PENDING
    if not suspended and (condition(status, Condition.SUSPENDED) or {}).get("status") == "True":
        conds = set_condition(conds, Condition.SUSPENDED, False, Reason.RESUMED,
                              "the Job runs again", now, generation)
    if queued and not suspended and job is not None:
        # Kueue un-suspends a Job only once its Workload is admitted.
        conds = set_condition(conds, Condition.ADMITTED, True, "Admitted", "admitted by Kueue",
                              now, generation)
    conds = _throttling_stopped(status, conds, out["phase"], now)
    for key in ("startTime", "completionTime"):
        if js.get(key):
            out[key] = js[key]
    out["conditions"] = conds
    return out


# The Failed reasons of a Job gone (status_job_gone); a Job seen to complete after all
# clears them.
GONE_REASONS = (Reason.JOB_DELETED, Reason.JOB_GONE)


def status_job_gone(status: Mapping[str, Any], job: str, now: str,
                    deleted: bool = False) -> dict[str, Any]:
    """The ThrottledJob's Job (or JobSet) `job` is gone: `deleted` as its watch showed
    (its last state read first, by status_from_job), else not found. Gone after it
    finished (its ttlSecondsAfterFinished, a clean-up), the status stays. Gone before,
    or with its end not seen: Failed, and the operator never makes it again, as a Job
    made anew would run the work a second time."""
    if status.get("jobName") != job or status.get("phase") in (Phase.SUCCEEDED, Phase.FAILED):
        return dict(status)
    reason, message = ((Reason.JOB_DELETED, f"{job} was deleted before it finished")
                       if deleted else
                       (Reason.JOB_GONE, f"{job} is gone and its end was not seen (deleted, "
                        "or removed by its ttlSecondsAfterFinished while the operator was not "
                        "watching)"))
    message += "; delete and re-create the ThrottledJob to run it again"
    out = dict(status)
    out["phase"] = Phase.FAILED
    conds = set_condition(status.get("conditions"), Condition.FAILED, True, reason, message,
                          now)
    conds = set_condition(conds, Condition.READY, False, reason, message, now)
    out["conditions"] = _throttling_stopped(status, conds, Phase.FAILED, now)
    return out


def _throttling_stopped(status: Mapping[str, Any], conds: list[dict[str, Any]], phase: str,
                        now: str) -> list[dict[str, Any]]:
    """Throttling False where the Job is not running (any more, or yet); the last observed
    peaks stay."""
    if phase == Phase.RUNNING or not condition(status, Condition.THROTTLING):
        return conds
    return set_condition(conds, Condition.THROTTLING, False, Reason.NOT_RUNNING,
                         f"the Job is {phase}", now)


def status_held_back(status: Mapping[str, Any], generation: int | None,
                     now: str) -> dict[str, Any]:
    """Suspended before its Job was made (spec.suspend under Kueue): no Job yet."""
    out = at_generation(status, generation)
    out["phase"] = Phase.SUSPENDED
    out["conditions"] = set_condition(
        out.get("conditions"), Condition.SUSPENDED, True, Reason.SUSPEND_REQUESTED,
        "spec.suspend is true: the Job is made when it is cleared (Kueue would admit it "
        "before it could be held)", now, generation)
    return out


def status_with_admission(status: Mapping[str, Any], workload: Mapping[str, Any] | None,
                          tj: Mapping[str, Any], now: str) -> dict[str, Any]:
    """The Admitted condition from the Job's Kueue Workload, in Kueue's words (why it
    waits: Pending, Inadmissible, ... with Kueue's message)."""
    admitted, reason, message = admission(workload)
    out = dict(status)
    out["conditions"] = set_condition(status.get("conditions"), Condition.ADMITTED, admitted,
                                      reason, message, now,
                                      (tj.get("metadata") or {}).get("generation"))
    return out
