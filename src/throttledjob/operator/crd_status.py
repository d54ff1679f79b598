"""The schema of the ThrottledJob's `status`: phase and conditions, the job-wide split
(scope Job), and `observed`, generated from contracts.status.OBSERVED; the printer
columns that show it (crd.py assembles the CRD)."""

from __future__ import annotations

from typing import Any

from throttledjob.contracts.status import LEVERS, OBSERVED, Aggregate, ObservedField

from .api_names import MAX_GPUS, MAX_RANKS, MAX_UUID_LENGTH, PHASES
from .job_split import JOB_WIDE_FIGURES, RANK_FIGURES


def condition_schema() -> dict[str, Any]:
    """metav1.Condition, so `kubectl wait --for=condition=Complete` works."""
    return {
        "type": "object",
        "required": ["type", "status", "lastTransitionTime", "reason", "message"],
        "properties": {
            "type": {"type": "string", "maxLength": 316},
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "reason": {"type": "string", "maxLength": 1024},
            "message": {"type": "string", "maxLength": 32768},
        },
    }


def observed_schema(f: ObservedField) -> dict[str, Any]:
    """The schema of one field of `status.observed`, from contracts.status.OBSERVED."""
    bounds = {k: v for k, v in (("minimum", f.minimum), ("maximum", f.maximum))
              if v is not None}
    return {"type": f.type, **({"format": "int64"} if f.type == "integer" else {}),
            **({"nullable": True} if f.nullable else {}), **bounds,
            "description": f"{f.description} ({f.unit})."}


def _number(description: str) -> dict[str, Any]:
    return {"type": "number", "nullable": True, "minimum": 0, "description": description}


def status_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "phase": {"type": "string", "enum": PHASES},
            "jobName": {"type": "string"},
            "observedGeneration": {"type": "integer", "format": "int64"},
            "startTime": {"type": "string", "format": "date-time"},
            "completionTime": {"type": "string", "format": "date-time"},
            "conditions": {
                "type": "array", "items": condition_schema(),
                "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
            },
            "jobWide": {
                "type": "object",
                "description": "scope Job: the whole Job against its CPU target.",
                "properties": {k: _number(d) for k, d in JOB_WIDE_FIGURES.items()},
            },
            "ranks": {
                "type": "array", "maxItems": MAX_RANKS,
                "description": "scope Job: each running pod's share of the target and "
                               "what it did with it, by completion index.",
                "items": {"type": "object", "required": ["pod"], "properties": {
                    "pod": {"type": "string"},
                    "index": {"type": "integer", "nullable": True,
                              "description": "the Indexed Job's completion index"},
                    "job": {"type": "integer",
                            "description": "a JobSet's pod: its Job's global index"},
                    **{k: _number(d) for k, d in RANK_FIGURES.items()},
                }},
            },
            "observed": {
                "type": "object",
                "description": "Read from the sidecars' /status: the worst pod's figures, "
                               "the steps summed over the pods.",
                "properties": {
                    **{f.name: observed_schema(f) for f in OBSERVED
                       if f.aggregate is not Aggregate.POD},
                    "levers": {"type": "array", "maxItems": len(LEVERS),
                               "items": {"type": "string", "enum": list(LEVERS)},
                               "description": "What held the peak in any pod"},
                    "gpus": {"type": "array", "nullable": True, "maxItems": MAX_GPUS,
                             "items": {"type": "string", "maxLength": MAX_UUID_LENGTH},
                             "description": "The GPUs the pods read, by UUID (as "
                                            "`nvidia-smi -L` names them), sorted"},
                    "pods": {"type": "integer", "minimum": 0},
                    "lastReadTime": {"type": "string", "format": "date-time",
                                     "description": "When a read last changed the "
                                                    "figures, or at least each minute "
                                                    "while the sidecars answer"},
                    "errors": {"type": "array", "maxItems": 16, "items": {"type": "string"}},
                },
            },
        },
    }


def printer_columns() -> list[dict[str, Any]]:
    """`kubectl get tj`: what was asked, what was seen, whether it held, what it cost;
    the GPU and job-wide figures and what held the peak with `-o wide`."""
    return [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "CPU-Target", "type": "string", "jsonPath": ".spec.throttle.targets.cpu.peak",
         "description": "the CPU peak target (scope Job: of the pods' sum)"},
        {"name": "CPU-Peak", "type": "number", "jsonPath": ".status.observed.cpuPeakCores",
         "description": "p99 CPU of the workload, cores"},
        {"name": "Target-Met", "type": "string",
         "jsonPath": '.status.conditions[?(@.type=="TargetMet")].status',
         "description": "the TargetMet condition: True, False (its reason says why) or "
                        "Unknown (not measured yet)"},
        {"name": "Slowdown", "type": "number", "jsonPath": ".status.observed.slowdown",
         "description": "the slowdown so far, as a factor (maxSlowdown is its budget)"},
        {"name": "Throttle", "type": "number", "jsonPath": ".status.observed.throttleLevel",
         "description": "0 = untouched, 1 = the most the slowdown budget allows"},
        {"name": "GPU-Peak", "type": "number",
         "jsonPath": ".status.observed.gpuPeakUtilizationPercent", "priority": 1,
         "description": "p99 GPU utilization, percent (kubectl get -o wide)"},
        {"name": "Job-CPU-Peak", "type": "number", "jsonPath": ".status.jobWide.cpuPeakCores",
         "priority": 1, "description": "scope Job: the sum of the pods' p99 CPU, cores"},
        {"name": "Levers", "type": "string", "jsonPath": ".status.observed.levers",
         "priority": 1, "description": "what held the peak (kubectl get -o wide)"},
        {"name": "Steps", "type": "integer", "jsonPath": ".status.observed.steps",
         "priority": 1, "description": "units of work the workloads reported"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
