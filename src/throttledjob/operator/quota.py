"""Whether the kernel's quota holds a ThrottledJob's CPU target: decided here, once.

With enforcement Quota the operator sets the workload containers' CPU limits from the
target (cpu_limits.py), unless a container's request is over its share of it: a limit may
not be under its request. Where the limits cannot be set, signals and pacing hold the
target, and the pods' policy says so: its enforcement is Both. The Job's limits
(children.build_child), the pods' live resizes (writes.cpu_target), the policy the
sidecar reads (pod_policy) and the QuotaUnavailable event (why_not) all read this
decision; the sidecar infers none of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from throttledjob.contracts.policy import Enforcement

from . import child, cpu_limits, job_split


def why_not(spec: Mapping[str, Any], policy_doc: Mapping[str, Any]) -> str | None:
    """Why enforcement Quota cannot set the limits of this spec's pods, or None (it can,
    or the policy does not ask for it)."""
    return _why_not(spec, cpu_limits.quota_target(policy_doc))


def kernel_target(spec: Mapping[str, Any], policy_doc: Mapping[str, Any]) -> float | None:
    """The CPU target (cores; job-wide under scope Job) that the pods' CPU limits hold,
    or None: the kernel's quota holds none."""
    target = cpu_limits.quota_target(policy_doc)
    return None if _why_not(spec, target) else target


def pod_policy(spec: Mapping[str, Any], policy_doc: Mapping[str, Any]) -> dict[str, Any]:
    """The policy the pods' sidecars read: the spec's, with enforcement Both where Quota
    cannot set the limits (the sidecar then holds the target with signals and pacing)."""
    doc = dict(policy_doc)
    if _why_not(spec, cpu_limits.quota_target(doc)):
        doc["enforcement"] = str(Enforcement.BOTH).capitalize()
    return doc


def _why_not(spec: Mapping[str, Any], target: float | None) -> str | None:
    """The policy parsed once by the caller: `target` is its quota_target."""
    pod_target = job_split.pod_target(spec, target)
    if pod_target is None:
        return None
    return next((why for pod in child.pod_specs(spec)
                 if (why := cpu_limits.request_over_limit(pod.get("containers") or [],
                                                          pod_target))), None)
