"""The ThrottleBudget CustomResourceDefinition: a CPU peak and/or a GPU-watt peak held
across the ThrottledJobs of a namespace that its selector picks (fleet_split.py divides
each). Written beside the
ThrottledJob's by `python -m throttledjob.operator.crd --write`; a test fails when the
chart's copy drifts.

Namespaced, so who may set a budget over which jobs is the namespace's RBAC: a budget
can only select the ThrottledJobs of its own namespace.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from throttledjob.contracts.policy import CPU_QUANTITY_PATTERN

from .api_names import GROUP, VERSION
from .crd_status import condition_schema

BUDGET_KIND = "ThrottleBudget"
BUDGET_PLURAL = "throttlebudgets"
BUDGET_CRD_FILE = Path("charts/throttledjob/crds") / f"{GROUP}_{BUDGET_PLURAL}.yaml"
MAX_WINDOWS = 24
MAX_MEMBERS = 256
MAX_WATTS = 10_000_000  # a hall's power, in watts
CLOCK_PATTERN = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"

_CPU_RULE = (f"type(self) == int ? self > 0 : self.matches('"
             f"{CPU_QUANTITY_PATTERN.replace(chr(92), chr(92) * 2)}') && size(self) <= 16")


def _fraction(description: str) -> dict[str, Any]:
    return {"type": "number", "minimum": 0, "maximum": 1, "description": description}


def _label_selector() -> dict[str, Any]:
    strings = {"type": "array", "items": {"type": "string"}}
    return {
        "type": "object",
        "description": "The ThrottledJobs of this namespace the budget holds, by their "
                       "labels (a Kubernetes label selector); empty or absent: all of them.",
        "properties": {
            "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
            "matchExpressions": {"type": "array", "items": {
                "type": "object", "required": ["key", "operator"],
                "properties": {"key": {"type": "string"},
                               "operator": {"type": "string",
                                            "enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                               "values": strings}}},
        },
    }


def _gpu_schema() -> dict[str, Any]:
    return {
        "type": "object", "required": ["peakWatts"],
        "properties": {"peakWatts": {
            "type": "number", "minimum": 1, "maximum": MAX_WATTS,
            "description": "The most power the members' GPUs may draw together, "
                           "watts (board power, as NVML reads it). Held through "
                           "each member's GPU power target (targets.gpu."
                           "peakPowerWatts, its share over its GPUs): by the "
                           "board's cap where the member allows the lever "
                           "(levers.gpuPowerLimit), else by holding its work "
                           "back."}},
    }


def _spec_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "x-kubernetes-validations": [{
            "rule": "has(self.cpu) || has(self.gpu)",
            "message": "a budget needs cpu.peak or gpu.peakWatts (or both)"}],
        "properties": {
            "selector": _label_selector(),
            "gpu": _gpu_schema(),
            "cpu": {
                "type": "object", "required": ["peak"],
                "properties": {"peak": {
                    "x-kubernetes-int-or-string": True,
                    "description": "The most CPU the members' workloads may use together, "
                                   'a Kubernetes quantity: 8 or "7500m" or "7.5".',
                    "x-kubernetes-validations": [{
                        "rule": _CPU_RULE,
                        "message": 'cpu.peak must be a CPU quantity like 8, "7500m" or '
                                   '"7.5", over 0'}]}},
            },
            "schedule": {
                "type": "array", "maxItems": MAX_WINDOWS,
                "description": "Windows of the day (UTC) in which the budget is a fraction "
                               "of its peaks; the lowest window in force wins.",
                "items": {
                    "type": "object", "required": ["start", "end", "fraction"],
                    "properties": {
                        "start": {"type": "string", "pattern": CLOCK_PATTERN,
                                  "description": "HH:MM, UTC."},
                        "end": {"type": "string", "pattern": CLOCK_PATTERN,
                                "description": "HH:MM, UTC; before start: the window "
                                               "runs past midnight."},
                        "fraction": _fraction("The budget in the window, of its peaks."),
                    },
                },
            },
            "floorsOverBudget": {
                "type": "string", "enum": ["Report", "Suspend"], "default": "Report",
                "description": "Where even the members' floors (their CPU requests) pass "
                               "the budget. Report: each is held at its floor and the "
                               "BudgetMet condition says so. Suspend: the lowest-priority "
                               "members that Kueue queues are suspended (their Workloads "
                               "deactivated: their pods stop) until the others' floors fit, "
                               "and resumed once theirs fit again.",
            },
            "signal": {
                "type": "object", "required": ["fraction"],
                "description": "Set by an outside system (a grid operator's demand "
                               "response): the budget is this fraction of its peaks until "
                               "`until` (absent: until removed).",
                "properties": {
                    "fraction": _fraction("The budget while the signal holds, of its "
                                          "peaks."),
                    "until": {"type": "string", "format": "date-time"},
                },
            },
        },
    }


def _member_schema() -> dict[str, Any]:
    def number(d: str) -> dict[str, Any]:
        return {"type": "number", "minimum": 0, "description": d}

    return {
        "type": "object", "required": ["name"],
        "properties": {
            "name": {"type": "string"},
            "shareCores": number("The member's part of the CPU budget, job-wide."),
            "demandCores": number("What it would use unheld: the mean of its last reads."),
            "shareWatts": number("Its part of the GPU-watt budget, job-wide (its GPUs' "
                                 "power target is this over their number)."),
            "demandWatts": number("What its GPUs would draw unheld: the mean of its last "
                                  "reads."),
            "slowdown": number("Its expected slowdown at its shares, from its demand (the "
                               "larger of the CPU's and the GPU power's)."),
            "maxSlowdown": number("Its own slowdown budget (absent: none)."),
            "withinMaxSlowdown": {"type": "boolean"},
            "read": {"type": "boolean",
                     "description": "True: split by its measured demand. False: not "
                                    "measured yet (an even share, or after a restart the "
                                    "share it had) or its sidecars did not answer (it "
                                    "keeps the share it had)."},
            "priority": {"type": "integer", "description": "Its priority: the label "
                         "throttledjob.io/priority, else its Kueue Workload's."},
            "heldBy": {"type": "string",
                       "description": "Another budget gives it less: that one holds it."},
        },
    }


def _status_schema() -> dict[str, Any]:
    def number(d: str) -> dict[str, Any]:
        return {"type": "number", "minimum": 0, "description": d}

    return {
        "type": "object",
        "properties": {
            "observedGeneration": {"type": "integer", "format": "int64"},
            "cpuBudgetCores": number("The budget in force now (schedule and signal applied)."),
            "budgetSource": {"type": "string",
                             "description": "What set it: spec, a schedule window, a signal."},
            "cpuCores": number("The members' CPU use summed, at their last reads."),
            "cpuFloorCores": number("The least the members can be held to together."),
            "gpuBudgetWatts": number("The GPU-watt budget in force now."),
            "gpuDemandWatts": number("What the members' GPUs would draw unheld, summed "
                                     "(the means of their last reads)."),
            "gpuFloorWatts": number("The least the members' GPUs can be capped to "
                                    "together (their boards' lowest limits)."),
            "splitTime": {"type": "string", "format": "date-time"},
            "members": {"type": "array", "maxItems": MAX_MEMBERS, "items": _member_schema()},
            "suspended": {"type": "array", "maxItems": MAX_MEMBERS,
                          "items": {"type": "string"},
                          "description": "The ThrottledJobs it keeps suspended "
                                         "(floorsOverBudget: Suspend)."},
            "conditions": {"type": "array", "items": condition_schema(),
                           "x-kubernetes-list-type": "map",
                           "x-kubernetes-list-map-keys": ["type"]},
        },
    }


def build_budget_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{BUDGET_PLURAL}.{GROUP}",
                     "labels": {"app.kubernetes.io/name": "throttledjob",
                                "app.kubernetes.io/component": "crd"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": BUDGET_PLURAL, "singular": BUDGET_KIND.lower(),
                      "kind": BUDGET_KIND, "listKind": f"{BUDGET_KIND}List",
                      "shortNames": ["tb"]},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "A CPU peak and/or a GPU-watt peak held across many "
                                   "ThrottledJobs, split among them by what throttling "
                                   "costs each.",
                    "properties": {"apiVersion": {"type": "string"},
                                   "kind": {"type": "string"},
                                   "metadata": {"type": "object"},
                                   "spec": _spec_schema(),
                                   "status": _status_schema()},
                    "required": ["spec"],
                }},
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Budget", "type": "number", "jsonPath": ".status.cpuBudgetCores"},
                    {"name": "Use", "type": "number", "jsonPath": ".status.cpuCores"},
                    {"name": "GPU-Watts", "type": "number",
                     "jsonPath": ".status.gpuBudgetWatts"},
                    {"name": "Met", "type": "string",
                     "jsonPath": '.status.conditions[?(@.type=="BudgetMet")].status'},
                    {"name": "Reason", "type": "string",
                     "jsonPath": '.status.conditions[?(@.type=="BudgetMet")].reason'},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
            }],
        },
    }
