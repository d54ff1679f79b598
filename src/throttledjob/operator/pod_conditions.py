"""Conditions a ThrottledJob takes from its pods as the kubelet reports them: a CPU-limit
resize not applied yet (QuotaResized), a container that cannot start (PodsStarted: an
image the node cannot pull or does not have). Each is absent until a pod first had the
problem, False while one has, True again once none has. Pure functions of the pods."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .conditions import Condition, Reason, condition, set_condition

# The kubelet's waiting reasons of a container that will not start on its own: the image
# (pull refused, back-off, absent under pullPolicy Never, a bad name) or its config.
CANNOT_START = frozenset({"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull",
                          "InvalidImageName", "CreateContainerConfigError"})


def pending_resizes(pods: list[Mapping[str, Any]]) -> list[str]:
    """"pod: Reason: message" of each pod whose CPU-limit resize the kubelet has not
    applied (its PodResizePending condition: Deferred, or Infeasible)."""
    out = []
    for pod in pods:
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodResizePending" and c.get("status") == "True":
                out.append(f"{_name(pod)}: {c.get('reason') or 'Pending'}: "
                           f"{c.get('message') or ''}".strip())
    return out


def status_with_resizes(status: Mapping[str, Any], pending: list[str],
                        now: str) -> dict[str, Any]:
    """QuotaResized: False while a pod's resize is pending (the kernel still holds its old
    limits: the sidecar's signals hold a lower target, a higher one stays held at the old
    limit), True again once none is."""
    return _with_problems(status, Condition.QUOTA_RESIZED, pending, Reason.RESIZE_PENDING,
                          Reason.QUOTA_RESIZED, "every pod's CPU limits are the target's", now)


def stuck_containers(pods: list[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(the kubelet's reason, "pod/container: image: message") of each container, the
    sidecar's included, that cannot start (CANNOT_START)."""
    out = []
    for pod in pods:
        st = pod.get("status") or {}
        for c in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
            waiting = (c.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in CANNOT_START:
                out.append((waiting["reason"],
                            f"{_name(pod)}/{c.get('name')}: image {c.get('image')}: "
                            f"{(waiting.get('message') or waiting['reason'])[:300]}"))
    return out


def status_with_stuck(status: Mapping[str, Any], stuck: list[tuple[str, str]],
                      now: str) -> dict[str, Any]:
    """PodsStarted: False, with the kubelet's reason, while a container cannot start."""
    return _with_problems(status, Condition.PODS_STARTED, [m for _, m in stuck],
                          stuck[0][0] if stuck else Reason.STARTED, Reason.STARTED,
                          "no container is held back by its image", now)


def _with_problems(status: Mapping[str, Any], type_: str, problems: list[str],
                   bad_reason: str, good_reason: str, good_message: str,
                   now: str) -> dict[str, Any]:
    if not problems and condition(status, type_) is None:
        return dict(status)
    out = dict(status)
    out["conditions"] = set_condition(
        status.get("conditions"), type_, not problems,
        bad_reason if problems else good_reason,
        "; ".join(problems) if problems else good_message, now)
    return out


def _name(pod: Mapping[str, Any]) -> str:
    return (pod.get("metadata") or {}).get("name") or "?"
