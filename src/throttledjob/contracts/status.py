"""The `/status` document: what each sidecar tells the operator (GET :9400/status).

The operator copies `observed` into the ThrottledJob's status (the worst pod counts) and
sets the TargetMet condition from `targetMet` and `budgetExhausted`. `version` changes
only when a field changes meaning or goes away; new fields may appear within a version.
A document with no `version` is version 1 (sidecars before the field was added).
"""

from __future__ import annotations

import math
from typing import Any, TypedDict

STATUS_VERSION = 1
# The levers a run may report as used, in this order (also the `lever` label of
# throttledjob_lever_active).
LEVERS = ("quota", "signals", "pacing", "threads", "batch", "rate_limit", "nice", "cpu_affinity",
          "gpu_memory_fraction", "gpu_power_limit")
OBSERVED_NUMBERS = ("cpuPeakCores", "cpuMaxCores", "gpuPeakUtilizationPercent",
                    "gpuMaxUtilizationPercent", "gpuPeakPowerWatts", "gpuMaxPowerWatts",
                    "throttleLevel", "slowdown", "cpuCores")


class Observed(TypedDict):
    # p99 and maximum of the 1-second samples since the start (None: nothing measured).
    cpuPeakCores: float | None
    cpuMaxCores: float | None
    gpuPeakUtilizationPercent: float | None
    gpuMaxUtilizationPercent: float | None
    gpuPeakPowerWatts: float | None
    gpuMaxPowerWatts: float | None
    throttleLevel: float  # 0 (no throttle) .. 1
    slowdown: float  # estimated wall time / unthrottled wall time
    cpuCores: float  # the last cycle's use
    steps: int


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
    targetMet: bool
    budgetExhausted: bool
    # In a pod: the workload's summed CPU limit the slowdown budget needs, where the
    # target's would pass it (None: the target's); the operator resizes the pod to it.
    cpuLimitWantedCores: float | None
    # In a pod: cores each workload container wanted in the last interval (its use, or
    # its width where its limit held it back), by container name; the operator splits the
    # pod's limit by it. Empty where unknown.
    cpuDemandCores: dict[str, float]
    levers: list[str]
    targets: Targets
    errors: list[str]  # "kind: message" of each problem in force now
    telemetry: Telemetry
    cycles: int


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
    errors = doc.get("errors")
    wanted = finite_number(doc.get("cpuLimitWantedCores"))
    if wanted is not None and wanted <= 0:
        wanted = None
    demand = doc.get("cpuDemandCores")
    # Only what could be a share: a finite, non-negative number by a string name.
    numbers = {k: finite_number(v) for k, v in demand.items() if isinstance(k, str)} \
        if isinstance(demand, dict) else {}
    return {**doc, "version": STATUS_VERSION, "observed": observed,  # type: ignore[typeddict-item]
            "targetMet": doc.get("targetMet") is True,
            "budgetExhausted": doc.get("budgetExhausted") is True,
            "cpuLimitWantedCores": wanted,
            "cpuDemandCores": {k: v for k, v in numbers.items() if v is not None and v >= 0},
            "errors": [str(e) for e in errors] if isinstance(errors, list) else []}
