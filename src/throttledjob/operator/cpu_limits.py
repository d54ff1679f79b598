"""The workload's CPU limits from the CPU target: with enforcement Quota the kernel's CFS
quota of each workload container holds the target, as `resources.limits.cpu` does for
any pod, at no CPU cost and with no signal sent.

Pure functions over the pod template's containers. Requests stay as the user wrote them
(a Burstable pod); a limit the user wrote below the container's share is kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from throttledjob.contracts.policy import PolicyError, parse_cpu_quantity, parse_policy

# The smallest limit worth setting: the kernel's quota has a 1 ms floor per 100 ms period.
MIN_MILLICORES = 10
# A split by measured use gives each container at least this fraction of an even share:
# one idle in the last interval still runs when it wakes, and its width then moves the
# split back.
MIN_EVEN_FRACTION = 0.1
# In-place resize (Kubernetes 1.35+) may change the limit without a restart.
RESIZE_POLICY = [{"resourceName": "cpu", "restartPolicy": "NotRequired"}]


def quota_target(policy_doc: Mapping[str, Any]) -> float | None:
    """The CPU target (cores) the kernel's quota is to hold: enforcement Quota with a CPU
    target; else None."""
    policy = parse_policy(dict(policy_doc))
    return policy.cpu_peak_cores if policy.enforced_by_the_kernel else None


def _cpu(container: Mapping[str, Any], kind: str) -> float | None:
    return cores(((container.get("resources") or {}).get(kind) or {}).get("cpu"))


def cores(value: Any) -> float | None:
    """A CPU quantity in cores; None where absent or not one."""
    if value is None:
        return None
    try:
        return parse_cpu_quantity(value, "cpu")
    except PolicyError:
        return None


def shares(containers: Sequence[Mapping[str, Any]], target_cores: float,
           demand: Mapping[str, float] | None = None) -> list[float]:
    """Each container's part of the target: in proportion to the cores each wanted
    (`demand`, by name: one not named has no process to measure and wants nothing), none
    under its CPU request or a tenth of an even share; without a demand, in proportion to
    its CPU request when every container has one; else even."""
    requests = [_cpu(c, "requests") for c in containers]
    wanted = [max(0.0, (demand or {}).get(c.get("name", ""), 0.0)) for c in containers]
    if sum(wanted) > 0:
        even = target_cores / len(containers)
        floors = [max(r or 0.0, MIN_EVEN_FRACTION * even) for r in requests]
        return split(wanted, floors, target_cores)
    if all(r for r in requests):
        total = sum(requests)  # type: ignore[arg-type]
        return [target_cores * r / total for r in requests]  # type: ignore[operator]
    return [target_cores / len(containers)] * len(containers)


def split(weights: Sequence[float], floors: Sequence[float], total: float) -> list[float]:
    """`total` in proportion to `weights`, each part at least its floor: a part under its
    floor gets the floor and the rest is split again among the others."""
    if sum(floors) >= total:
        return [total * f / sum(floors) for f in floors]
    fixed: dict[int, float] = {}
    while True:
        free = [i for i in range(len(weights)) if i not in fixed]
        left, weight = total - sum(fixed.values()), sum(weights[i] for i in free)
        parts = {i: left * weights[i] / weight if weight > 0 else left / len(free)
                 for i in free}
        under = [i for i in free if parts[i] < floors[i]]
        if not under:
            return [fixed[i] if i in fixed else parts[i] for i in range(len(weights))]
        fixed.update((i, floors[i]) for i in under)


def limits(containers: Sequence[Mapping[str, Any]], target_cores: float,
           demand: Mapping[str, float] | None = None) -> list[int]:
    """The CPU limit of each container, millicores: its share, rounded down (the sum
    never passes the target), or the user's own limit where that is lower."""
    out = []
    for container, share in zip(containers, shares(containers, target_cores, demand),
                                strict=True):
        milli = max(MIN_MILLICORES, int(share * 1000 + 1e-6))
        own = _cpu(container, "limits")
        out.append(min(milli, int(own * 1000)) if own is not None else milli)
    return out


def request_over_limit(containers: Sequence[Mapping[str, Any]],
                       target_cores: float) -> str | None:
    """Why the limits cannot be set (a limit may not be under the container's request),
    or None."""
    for container, milli in zip(containers, limits(containers, target_cores), strict=True):
        request = _cpu(container, "requests")
        if request is not None and request * 1000 > milli + 1e-6:
            return (f"container {container.get('name')} requests {request:g} CPU, more than "
                    f"its {milli}m share of the {target_cores:g}-core target")
    return None


def resize(pod_spec: Mapping[str, Any], target_cores: float,
           template: Sequence[Mapping[str, Any]], demand: Mapping[str, float] | None = None,
           tolerance: float = 0.0, guaranteed: bool = False) -> dict[str, Any] | None:
    """The `pods/resize` patch (strategic merge, by container name) that moves a running
    pod's workload containers to their shares of a new target (by `demand` where the
    sidecar measured any: see shares); None when they are there already (each within
    `tolerance` of its new limit, their sum not over it), or a request the user wrote is
    over its share. `template` is the user's containers (the ThrottledJob's jobTemplate):
    where one wrote no CPU request, the API server defaulted it to our limit, so the
    request is ours: it follows the limit down, and up only in a `guaranteed` pod (its QoS
    class may not change; elsewhere a request raised needs room on the node, which a grow
    of the limit does not, and passes what Kueue admitted). The shares alone count: the
    limits in the pod are the ones set from the last target (a lower limit the user first
    wrote is not known any more)."""
    written = {c.get("name"): _cpu(c, "requests") is not None for c in template}
    # The containers as the shares see them: the requests the user wrote, no limits.
    containers = []
    for c in pod_spec.get("containers") or []:
        requests = dict((c.get("resources") or {}).get("requests") or {})
        if not written.get(c.get("name"), True):
            requests.pop("cpu", None)
        containers.append({**c, "resources": {"requests": requests}})
    if not containers or request_over_limit(containers, target_cores):
        return None
    wanted = limits(containers, target_cores, demand)
    current = [_cpu(c, "limits") for c in pod_spec["containers"]]
    if all(c is not None for c in current) and sum(current) * 1000 <= sum(wanted) + 0.5 and all(
            abs(c * 1000 - w) <= max(tolerance * w, 0.5)  # type: ignore[operator]
            for c, w in zip(current, wanted, strict=True)):
        return None
    patch = []
    for c, now, w in zip(containers, pod_spec["containers"], wanted, strict=True):
        resources: dict[str, Any] = {"limits": {"cpu": f"{w}m"}}
        request = _cpu(now, "requests")
        if not written.get(c["name"], True) and (
                guaranteed or request is None or request * 1000 > w + 0.5):
            resources["requests"] = {"cpu": f"{w}m"}
        patch.append({"name": c["name"], "resources": resources})
    return {"spec": {"containers": patch}}


def limits_by_name(pod_spec: Mapping[str, Any]) -> dict[str, float]:
    """A pod's container CPU limits, cores, by container name (those that have one)."""
    out = {c.get("name", ""): _cpu(c, "limits") for c in pod_spec.get("containers") or []}
    return {name: cores for name, cores in out.items() if cores is not None}


def total_request(pod_spec: Mapping[str, Any]) -> float | None:
    """The sum of a pod's container CPU requests (what Kueue admits), cores; None when
    one has none (the API server defaults a request to the limit: it is set then)."""
    requests = [_cpu(c, "requests") for c in pod_spec.get("containers") or []]
    return sum(requests) if requests and all(x is not None for x in requests) else None  # type: ignore[misc]


def total_limit(pod_spec: Mapping[str, Any]) -> float | None:
    """The sum of a pod's container CPU limits, cores; None when one has none."""
    limits = [_cpu(c, "limits") for c in pod_spec.get("containers") or []]
    return sum(limits) if limits and all(x is not None for x in limits) else None  # type: ignore[misc]


def apply(containers: Sequence[dict[str, Any]], target_cores: float) -> float:
    """Set each container's CPU limit and its resize policy; returns the limits' sum,
    cores. Call only where request_over_limit() is None."""
    milli = limits(containers, target_cores)
    for container, value in zip(containers, milli, strict=True):
        resources = container.setdefault("resources", {})
        resources.setdefault("limits", {})["cpu"] = f"{value}m"
        if not any(p.get("resourceName") == "cpu" for p in container.get("resizePolicy") or []):
            container.setdefault("resizePolicy", []).extend(RESIZE_POLICY)
    return sum(milli) / 1000
