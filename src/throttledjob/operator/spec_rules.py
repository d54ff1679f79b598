"""The rules that relate a ThrottledJob's fields, each written once: the CEL that the CRD
gives the API server (crd.py), its message, and the same rule in Python, which the
operator checks again (validation.py), for an object the server stored without them (an
older CRD, a server that skipped it). tests/cluster/test_crd_live.py asserts, on the real
API server, that the two refuse the same specs with the same message.

The API server applies the schema's defaults before it runs the CEL: `defaulted` gives
the Python side the same view.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from throttledjob.contracts.policy import POLICY_FIELDS

from .api_names import DEFAULT_INJECT, DEFAULT_SCOPE


@dataclass(frozen=True)
class SpecRule:
    """One rule over the object the CEL's `self` is."""

    cel: str
    message: str
    holds: Callable[[Mapping[str, Any]], bool]


def defaulted(throttle: Mapping[str, Any]) -> dict[str, Any]:
    """`spec.throttle` with the CRD's defaults where a field is absent (top level only:
    the defaulted fields are all there)."""
    defaults = {f.key: f.spelled_default
                for f in POLICY_FIELDS if f.crd_default and not f.group}
    return {**defaults, "inject": DEFAULT_INJECT, "scope": DEFAULT_SCOPE, **throttle}


def _targets(throttle: Mapping[str, Any]) -> Mapping[str, Any]:
    return throttle.get("targets") or {}


# Over `spec`.
SPEC_RULES = (
    SpecRule("(has(self.jobTemplate) ? 1 : 0) + (has(self.jobSetTemplate) ? 1 : 0) + "
             "(has(self.workloadRef) ? 1 : 0) + (has(self.labeledWorkloads) ? 1 : 0) == 1",
             "set exactly one of jobTemplate (a Job), jobSetTemplate (a JobSet), "
             "workloadRef (a workload made by someone else) and labeledWorkloads (the "
             "workloads labeled throttledjob.io/throttle with this name)",
             lambda spec: sum(k in spec for k in ("jobTemplate", "jobSetTemplate",
                                                  "workloadRef", "labeledWorkloads")) == 1),
    SpecRule("!has(self.labeledWorkloads) || "
             "!has(self.throttle.scope) || self.throttle.scope == 'Pod'",
             "labeledWorkloads has no one job to split a target among: scope must be Pod",
             lambda spec: "labeledWorkloads" not in spec
             or (spec.get("throttle") or {}).get("scope", DEFAULT_SCOPE) == "Pod"),
)

# Over `spec.throttle`, defaulted.
THROTTLE_RULES = (
    SpecRule("self.mode != 'Adaptive' || (has(self.targets) && "
             "(has(self.targets.cpu) || has(self.targets.gpu)))",
             "mode Adaptive needs a target: set targets.cpu or targets.gpu",
             lambda t: t["mode"] != "Adaptive"
             or "cpu" in _targets(t) or "gpu" in _targets(t)),
    SpecRule("self.scope != 'Job' || (has(self.targets) && has(self.targets.cpu) && "
             "!has(self.targets.gpu))",
             "scope Job holds a CPU target over the whole Job: set targets.cpu (a job-wide "
             "GPU target is not supported yet)",
             lambda t: t["scope"] != "Job"
             or ("cpu" in _targets(t) and "gpu" not in _targets(t))),
    SpecRule("self.scope != 'Job' || self.enforcement == 'Quota'",
             "scope Job is held by the pods' CPU limits: enforcement must be Quota",
             lambda t: t["scope"] != "Job" or t["enforcement"] == "Quota"),
)


def broken_spec(spec: Mapping[str, Any]) -> str | None:
    """The message of the first SPEC_RULES rule `spec` breaks, or None."""
    return next((r.message for r in SPEC_RULES if not r.holds(spec)), None)


def broken_throttle(throttle: Mapping[str, Any]) -> str | None:
    """The message of the first THROTTLE_RULES rule `spec.throttle` breaks, or None."""
    defaults = defaulted(throttle)
    return next((r.message for r in THROTTLE_RULES if not r.holds(defaults)), None)
