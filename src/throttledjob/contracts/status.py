"""The `/status` document: what each sidecar tells the operator (GET :9400/status).

The operator copies `observed` into the ThrottledJob's status (the worst pod counts) and
sets the TargetMet condition from `targetMet` and `budgetExhausted`. `version` changes
only when a field changes meaning or goes away; new fields may appear within a version.
A document with no `version` is version 1 (sidecars before the field was added).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from throttledjob.contracts.policy import Choice

STATUS_VERSION = 1
# The levers a run may report as used, in this order (also the `lever` label of
# throttledjob_lever_active).
LEVERS = ("quota", "signals", "pacing", "threads", "batch", "rate_limit", "nice", "cpu_affinity",
          "gpu_memory_fraction", "gpu_power_limit")


class Aggregate(Choice):
    """How the operator folds the pods' figures of a field into the ThrottledJob's
    `status.observed`."""

    WORST = "worst"  # the largest pod's: a peak held anywhere is what the user asked about
    SUM = "sum"  # counts that add up over the pods
    POD = "pod"  # the pod's own figure only, never copied into the ThrottledJob


@dataclass(frozen=True)
class ObservedField:
    """One figure of what a run observed: `observed` of the /status document, and (unless
    `aggregate` is POD) of the ThrottledJob's `status.observed`."""

    name: str
    type: str  # "number" or "integer", as the CRD's schema spells it
    unit: str
    aggregate: Aggregate
    description: str
    nullable: bool = True  # None: nothing measured (no GPU, no sample yet)
    minimum: float | None = None
    maximum: float | None = None
    # The ThrottledJob's figure where no pod gives one (only for fields never None).
    default: float | None = None


# The pace and the CPU cost of a step (stepsPerSecond, cpuSecondsPerStep) are the
# sidecar's over this many seconds: over one interval, a count of steps written a few
# times a second swung a DDP rank's cost by a third from read to read. The job-wide split
# (operator/job_split.py) waits as long after a rank's workload starts before it moves.
PACE_WINDOW_SECONDS = 10.0

# The one list of what a run observed: the sidecar builds `observed` from it
# (`observed_document`), `parse_status` reads it, the operator aggregates by it and the
# CRD's schema of `status.observed` is generated from it. Samples are 1-second ones
# since the sidecar's start; "peak" is their p99, "max" their maximum.
OBSERVED: tuple[ObservedField, ...] = (
    ObservedField("cpuPeakCores", "number", "cores", Aggregate.WORST,
                  "p99 of the workload's CPU use, summed over its processes"),
    ObservedField("cpuMaxCores", "number", "cores", Aggregate.WORST,
                  "maximum of the workload's CPU use, summed over its processes"),
    ObservedField("gpuPeakUtilizationPercent", "number", "percent", Aggregate.WORST,
                  "p99 of the busiest watched GPU's utilization"),
    ObservedField("gpuMaxUtilizationPercent", "number", "percent", Aggregate.POD,
                  "maximum of the busiest watched GPU's utilization"),
    ObservedField("gpuPeakPowerWatts", "number", "watts", Aggregate.WORST,
                  "p99 of the busiest watched GPU's board power"),
    ObservedField("gpuMaxPowerWatts", "number", "watts", Aggregate.POD,
                  "maximum of the busiest watched GPU's board power"),
    ObservedField("throttleLevel", "number", "fraction", Aggregate.WORST,
                  "0 = untouched, 1 = the most the slowdown budget allows",
                  nullable=False, minimum=0, maximum=1, default=0),
    ObservedField("slowdown", "number", "factor", Aggregate.WORST,
                  "estimated wall time over unthrottled wall time",
                  nullable=False, minimum=0, default=1),
    ObservedField("slowdownHigh", "number", "factor", Aggregate.WORST,
                  "the most the slowdown can be: lever settings charged at the most "
                  "they can cost (not measured yet: the most that setting can; measured "
                  "against an unthrottled rate read while held back: that rate at its "
                  "most)",
                  nullable=False, minimum=0, default=1),
    ObservedField("cpuCores", "number", "cores", Aggregate.POD,
                  "the workload's CPU use in the last control interval", nullable=False),
    ObservedField("steps", "integer", "steps", Aggregate.SUM,
                  "units of work the workloads reported", nullable=False, minimum=0, default=0),
    ObservedField("stepsPerSecond", "number", "steps per second", Aggregate.POD,
                  "the workload's pace over the last 10 s (0 where it reports no steps)",
                  nullable=False, minimum=0),
    ObservedField("cpuSecondsPerStep", "number", "seconds", Aggregate.POD,
                  "the workload's CPU cost of a step over the last 10 s (None where it "
                  "did no step), by which a job-wide target is split", minimum=0),
)
OBSERVED_NAMES = tuple(f.name for f in OBSERVED)
OBSERVED_NUMBERS = tuple(f.name for f in OBSERVED if f.type == "number")
# `observed` of a /status document: OBSERVED's names, each a number, a whole number or None.
Observed = dict[str, float | int | None]


def observed_document(values: Mapping[str, float | int | None]) -> Observed:
    """`observed` for a /status document, in OBSERVED's order; raises ValueError when
    the names are not exactly OBSERVED's (a field the operator or the CRD would lose, or
    one they expect and would never get)."""
    missing = [n for n in OBSERVED_NAMES if n not in values]
    unknown = sorted(set(values) - set(OBSERVED_NAMES))
    if missing or unknown:
        raise ValueError(f"observed: {missing} missing, {unknown} not in "
                         "contracts.status.OBSERVED")
    return {n: values[n] for n in OBSERVED_NAMES}


class Targets(TypedDict):
    cpuPeakCores: float | None
    gpuPeakUtilizationPercent: float | None
    gpuPeakPowerWatts: float | None
    gpuMemoryFraction: float | None
    maxSlowdown: float
    mode: str
    enforcement: str


class Telemetry(TypedDict):
    cpu: str
    gpu: str
    gpus: list[dict[str, Any]]
    processes: int


class StatusDocument(TypedDict):
    version: int
    observed: Observed
    # Both judged over the same recent window (the last minute of 1-second samples):
    # budgetExhausted says the budget stood in a target's way within it.
    targetMet: bool | None  # None: none missed, but one has no sample yet
    budgetExhausted: bool
    # Why the budget stands in the way, in words (None: it does not, or an older sidecar).
    budgetReason: str | None
    # In a pod: the workload's summed CPU limit the slowdown budget needs, where the
    # target's would pass it (None: the target's); the operator resizes the pod to it.
    cpuLimitWantedCores: float | None
    # In a pod: cores each workload container wanted in the last interval (its use, or
    # its width where its limit held it back), by container name; the operator splits the
    # pod's limit by it. Empty where unknown.
    cpuDemandCores: dict[str, float]
    # In a pod: the workload's summed demand each recent interval, [[Unix time, cores],
    # ...], oldest first (the last DEMAND_HISTORY_SECONDS): a ThrottleBudget weighs every
    # second, not only the one its read falls on. Empty where unknown.
    cpuDemandHistory: list[list[float]]
    # In a pod: its GPUs' summed draw with no cap and no hold-back each recent interval,
    # [[Unix time, watts], ...], as cpuDemandHistory (a GPU-watt budget weighs it).
    gpuDemandHistory: list[list[float]]
    levers: list[str]
    targets: Targets
    errors: list[str]  # "kind: message" of each problem in force now
    telemetry: Telemetry
    cycles: int


# The demand history a sidecar keeps and serves (cpuDemandHistory): a read every status
# interval (10 s by default) misses none of it.
DEMAND_HISTORY_SECONDS = 60

# A budgetReason read from a sidecar is cut to this many characters: it goes into the
# TargetMet condition's message.
MAX_REASON_CHARS = 200


def finite_number(v: Any) -> float | None:
    """`v` as a float where it is a finite number (not a bool), else None: JSON from
    Python may carry NaN, which the API server would refuse in a status patch."""
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        return None
    return float(v)


def parse_status(doc: Any) -> StatusDocument:
    """Check a decoded /status document from another program; raises ValueError naming
    what is wrong. Non-finite numbers in `observed` become None: JSON from Python may
    carry NaN, which the API server would refuse in a status patch."""
    if not isinstance(doc, dict) or not isinstance(doc.get("observed"), dict):
        raise ValueError("no 'observed' object in the answer")
    version = doc.get("version", 1)
    if version != STATUS_VERSION:
        raise ValueError(f"status version {version!r}, this operator reads {STATUS_VERSION}")
    observed = dict(doc["observed"])
    for key in OBSERVED_NUMBERS:
        if finite_number(observed.get(key)) is None:
            observed[key] = None
    errors, reason = doc.get("errors"), doc.get("budgetReason")
    wanted = finite_number(doc.get("cpuLimitWantedCores"))
    if wanted is not None and wanted <= 0:
        wanted = None
    demand = doc.get("cpuDemandCores")
    # Only what could be a share: a finite, non-negative number by a string name.
    numbers = {k: finite_number(v) for k, v in demand.items() if isinstance(k, str)} \
        if isinstance(demand, dict) else {}
    return {**doc, "version": STATUS_VERSION, "observed": observed,  # type: ignore[typeddict-item]
            "targetMet": _verdict(doc.get("targetMet", False)),
            "budgetExhausted": doc.get("budgetExhausted") is True,
            "budgetReason": reason[:MAX_REASON_CHARS] if isinstance(reason, str) else None,
            "cpuLimitWantedCores": wanted,
            "cpuDemandCores": {k: v for k, v in numbers.items() if v is not None and v >= 0},
            "cpuDemandHistory": _history(doc.get("cpuDemandHistory")),
            "gpuDemandHistory": _history(doc.get("gpuDemandHistory")),
            "errors": [str(e) for e in errors] if isinstance(errors, list) else []}


def all_met(verdicts: Iterable[bool | None]) -> bool | None:
    """Targets' (or pods') verdicts as one: missed if any is missed; else unknown (None)
    while any has no sample yet; else met. The sidecar's targetMet and the operator's
    TargetMet both read so."""
    verdicts = list(verdicts)
    if False in verdicts:
        return False
    return None if None in verdicts else True


def _history(v: Any) -> list[list[float]]:
    """A sidecar's cpuDemandHistory (or gpuDemandHistory): its [time, cores (watts)]
    pairs of finite, non-negative numbers in time order, the last DEMAND_HISTORY_SECONDS'
    worth at most; [] if any is not (an older sidecar, or a bad one: the budget falls
    back to one sample a read)."""
    if not isinstance(v, list) or len(v) > 4 * DEMAND_HISTORY_SECONDS:
        return []
    out: list[list[float]] = []
    for pair in v:
        if not isinstance(pair, list) or len(pair) != 2:
            return []
        t, value = finite_number(pair[0]), finite_number(pair[1])
        if t is None or value is None or value < 0 or (out and t <= out[-1][0]):
            return []
        out.append([t, value])
    return out


def _verdict(v: Any) -> bool | None:
    """A sidecar's targetMet: True, False, or None (not yet measured); anything else is
    not a verdict that the target is met."""
    return v if v is None or isinstance(v, bool) else False
