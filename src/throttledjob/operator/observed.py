"""`status.observed` and the conditions that follow from it (Throttling, TargetMet), from
the sidecars' /status documents: each figure folded over the pods as contracts.status
says; under scope Job, the job-wide figures and each rank's. Pure functions from the old
status to the new one, as in status.py."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from throttledjob.contracts.status import (
    LEVERS,
    OBSERVED,
    OBSERVED_NAMES,
    Aggregate,
    ObservedField,
    all_met,
    finite_number,
)

from .api_names import MAX_GPUS, MAX_RANKS, MAX_UUID_LENGTH
from .conditions import Condition, Reason, as_stored, set_condition
from .job_split import Rank, job_wide, rank_status

# A sidecar read whose figures are all within OBSERVED_TOLERANCE of the written ones is
# not written unless those are this old: a measured figure moves a little every
# interval, and one status patch per running ThrottledJob every interval was most of
# the operator's and the API server's work at 1,000 running
# (docs/dev/benchmarks-history.md, "Load").
# The figures of every second are the sidecar's Prometheus metrics.
READ_TIME_REFRESH_SECONDS = 60.0
OBSERVED_TOLERANCE = 0.05  # of the figure written, and at least OBSERVED_ABSOLUTE
OBSERVED_ABSOLUTE = 0.01


def _seconds_between(earlier: str, later: str) -> float:
    try:
        return (datetime.fromisoformat(later) - datetime.fromisoformat(earlier)).total_seconds()
    except ValueError:
        return float("inf")


def aggregate_observed(reports: list[Mapping[str, Any]], failures: list[str],
                       now: str) -> dict[str, Any]:
    """`status.observed` from the sidecars' /status documents: each field of
    contracts.status.OBSERVED folded over the pods as its `aggregate` says, then what
    held the peak, how many pods answered and what went wrong."""
    pods = [obs for r in reports if isinstance(obs := r.get("observed"), dict)]
    errors = [*failures, *(e for r in reports if isinstance(r.get("errors"), list)
                           for e in r["errors"])]
    # What held the peak, in any pod (in the sidecar's order): `kubectl get tj -o wide`
    # shows it beside the steps.
    used = {lever for r in reports if isinstance(r.get("levers"), list)
            for lever in r["levers"]}
    return {
        **{f.name: _fold(f, [obs.get(f.name) for obs in pods]) for f in OBSERVED
           if f.aggregate is not Aggregate.POD},
        "levers": [lever for lever in LEVERS if lever in used],
        "gpus": _gpus(reports) or None,
        "pods": len(reports),
        "lastReadTime": now,
        "errors": [str(e)[:500] for e in errors][:16],
    }


def _gpus(reports: list[Mapping[str, Any]]) -> list[str]:
    """The UUIDs of the GPUs the pods read (in a pod, those the kubelet gave it: the node
    agent answers for no other), sorted, at most MAX_GPUS."""
    uuids = {g["UUID"] for r in reports
             for g in (r.get("telemetry") or {}).get("gpus") or []
             if isinstance(g, dict) and isinstance(g.get("UUID"), str)}
    return sorted(u[:MAX_UUID_LENGTH] for u in uuids)[:MAX_GPUS]


def close_to(written: Mapping[str, Any], read: Mapping[str, Any]) -> bool:
    """Whether a new status.observed says what the written one says: the same fields,
    each figure within OBSERVED_TOLERANCE (or OBSERVED_ABSOLUTE) of the written one, the
    rest (pods, levers, errors) the same."""
    a = as_stored({**written, "lastReadTime": None})
    b = as_stored({**read, "lastReadTime": None})
    if a.keys() != b.keys():
        return False
    for key, x in a.items():
        fx, fy = finite_number(x), finite_number(b[key])
        if key in OBSERVED_NAMES and fx is not None and fy is not None:
            if abs(fx - fy) > max(OBSERVED_TOLERANCE * abs(fx), OBSERVED_ABSOLUTE):
                return False
        elif x != b[key]:
            return False
    return True


def _fold(f: ObservedField, values: list[Any]) -> float | int | None:
    """One field over the pods. A sidecar is another program: what is not a finite
    number (NaN is valid to Python's json module but not to the API server, which would
    refuse the whole status patch), or for a count not a whole number >= 0, is skipped."""
    if f.aggregate is Aggregate.SUM:
        return sum(n for n in values if isinstance(n, int) and not isinstance(n, bool)
                   and n >= 0)
    numbers = [v for v in map(finite_number, values) if v is not None]
    worst = max(numbers) if numbers else None
    if not f.nullable:
        # A figure every pod has: none, or a 0 (which a slowdown never is), reads as
        # the default.
        worst = worst or float(f.default or 0)
    # Within the CRD's bounds, which would refuse the whole patch.
    if worst is not None and f.minimum is not None:
        worst = max(float(f.minimum), worst)
    if worst is not None and f.maximum is not None:
        worst = min(float(f.maximum), worst)
    return worst


def status_with_observed(status: Mapping[str, Any], reports: list[Mapping[str, Any]],
                         failures: list[str], now: str) -> dict[str, Any]:
    """Observed peaks and the Throttling / TargetMet conditions; no reports (no pod
    answered) keeps the last observation and only records why."""
    out = dict(status)
    if not reports:
        if failures:
            observed = dict(status.get("observed") or {})
            observed["errors"] = [f[:500] for f in failures][:16]
            out["observed"] = observed
        return out
    observed = aggregate_observed(reports, failures, now)
    last = status.get("observed") or {}
    if (last.get("lastReadTime") and close_to(last, observed)
            and _seconds_between(last["lastReadTime"], now) < READ_TIME_REFRESH_SECONDS):
        observed = dict(last)  # what is written stands: nothing moved enough
    out["observed"] = observed
    level = observed["throttleLevel"]
    conds = set_condition(status.get("conditions"), Condition.THROTTLING, level > 0,
                          Reason.THROTTLING if level > 0 else Reason.UNDER_TARGET,
                          f"throttle level {level:.2f}, slowdown {observed['slowdown']:.2f}",
                          now)
    # Missed by any pod: False; else Unknown while a pod has a target with no sample yet.
    met = all_met(r.get("targetMet") for r in reports)
    exhausted = [r for r in reports if r.get("budgetExhausted")]
    why = next((r["budgetReason"] for r in exhausted if r.get("budgetReason")), None)
    if met is None:
        reason, message = Reason.NOT_MEASURED, (
            "a target has no sample yet (a GPU target stays so where no GPU is read)")
    elif met:
        reason, message = Reason.TARGET_MET, "the peak is at or under the target"
    elif exhausted:
        reason = Reason.BUDGET_EXHAUSTED
        message = "the target is unreachable within maxSlowdown" + (f": {why}" if why else "")
    else:
        reason, message = Reason.CONVERGING, "the peak is over the target; throttling harder"
    out["conditions"] = set_condition(conds, Condition.TARGET_MET, met, reason, message, now)
    return out



def status_with_split(status: Mapping[str, Any], target: float, ranks: list[Rank],
                      now: str) -> dict[str, Any]:
    """scope Job: status.jobWide and status.ranks, and TargetMet by the whole Job: the
    kernel holds each pod at its CPU limit, so the target is met while their sum is
    (each pod's sidecar judges only its own use)."""
    out = dict(status)
    wide = job_wide(target, ranks)
    out["jobWide"] = wide
    # The first MAX_RANKS (the schema's bound): a Job's parallelism raised past it after
    # creation must not make the API server refuse every status write.
    out["ranks"] = [rank_status(r) for r in ranks[:MAX_RANKS]]
    limits = wide["limitCores"]
    if limits is None:
        return out
    met = limits <= target + 1e-6
    out["conditions"] = set_condition(
        out.get("conditions"), Condition.TARGET_MET, met,
        Reason.LIMITS_WITHIN_TARGET if met else Reason.LIMITS_OVER_TARGET,
        f"the {len(ranks)} pods' CPU limits sum to {limits:g} of the {target:g}-core "
        f"job-wide target; their p99s sum to {wide['cpuPeakCores']}", now)
    return out
