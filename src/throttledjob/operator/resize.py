"""A running pod's CPU limits moved in place (`pods/resize`): to a new target after a live
edit (handlers.policy_changed), and over the target where the slowdown budget needs more
(the poller, from the sidecar's `cpuLimitWantedCores`). One implementation for both, so a
resize is reported the same way whoever asked for it.

The sidecar has no API token: it says what it wants in /status and the operator applies
it. What it may get is bounded where every resize is: the API server refuses a pod more
CPU than its node has, and a namespace's ResourceQuota on `limits.cpu` applies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import kopf

from . import cpu_limits
from .kube import ApiError, Kube
from .status import Reason


def limit_for(target_cores: float, wanted_cores: float | None,
              ceiling_cores: float | None = None) -> float:
    """The pod's summed limit: the sidecar's where the budget needs more than the target,
    up to `ceiling_cores` (what Kueue admitted, where it queues the Job)."""
    if wanted_cores is None or wanted_cores <= target_cores:
        return target_cores
    return max(target_cores, min(wanted_cores, ceiling_cores or wanted_cores))


def resize_pod(kube: Kube, body: Mapping[str, Any], pod: Mapping[str, Any], total: float,
               target: float, template: Sequence[Mapping[str, Any]],
               demand: Mapping[str, float] | None = None,
               tolerance: float = 0.0) -> bool | None:
    """Move one Pending or Running pod's workload limits to shares of `total` cores (by
    each container's measured `demand` where known: cpu_limits.shares), unless each is
    within `tolerance` of its share already. Returns None when there was nothing to do,
    True when resized, False when the API server refused (the old limits hold; a Warning
    says so). Raises ApiError when the failure may pass (retry)."""
    if (pod.get("status") or {}).get("phase") not in ("Pending", "Running"):
        return None
    patch = cpu_limits.resize(pod.get("spec") or {}, total, template, demand, tolerance)
    if patch is None:
        return None
    name = pod["metadata"]["name"]
    try:
        kube.resize_pod(pod["metadata"]["namespace"], name, patch)
    except ApiError as e:
        if e.transient:
            raise
        kopf.warn(body, reason=Reason.QUOTA_RESIZE_REFUSED,
                  message=f"pod {name}: CPU limits not resized to {total:g} cores ({e}); it "
                          "keeps the old ones")
        return False
    containers = patch["spec"]["containers"]
    split = "" if len(containers) < 2 else " (" + ", ".join(
        f"{c['name']} {c['resources']['limits']['cpu']}" for c in containers) + ")"
    if total > target:
        kopf.info(body, reason=Reason.QUOTA_LIFTED,
                  message=f"pod {name}: CPU limits lifted to {total:g} cores{split}: the "
                          f"{target:g}-core target would slow it more than maxSlowdown")
    else:
        kopf.info(body, reason=Reason.QUOTA_RESIZED,
                  message=f"pod {name}: CPU limits resized to the {target:g}-core "
                          f"target{split}")
    return True
