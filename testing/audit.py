"""The writes a user made, as the API server's audit log has them (tools/k8s/cluster.py
keeps one for every ServiceAccount): the operator's API cost per ThrottledJob, split
into its own calls and kopf's."""

from __future__ import annotations

from typing import Any

# What kopf writes itself (its progress and diff-base annotations on the ThrottledJob,
# the events it posts for kopf.info/warn), against the operator's own calls
# (operator/kube.py).
KOPF_WRITES = {("throttledjob.io", "throttledjobs", "patch"), ("", "events", "create"),
               ("events.k8s.io", "events", "create")}
WRITE_VERBS = ("create", "update", "patch", "delete")

Call = tuple[str, str, str]  # (API group, resource[/subresource], verb)


def writes(cluster: Any, user: str, namespace: str, since: int) -> dict[Call, int]:
    """How many times `user` made each write in `namespace`, after its first `since`
    audited calls."""
    counts: dict[Call, int] = {}
    for e in cluster.audit(user)[since:]:
        ref = e.get("objectRef") or {}
        if ref.get("namespace") != namespace or e.get("verb") not in WRITE_VERBS:
            continue
        key = (ref.get("apiGroup", ""), ref["resource"] + (
            f"/{ref['subresource']}" if ref.get("subresource") else ""), e["verb"])
        counts[key] = counts.get(key, 0) + 1
    return counts


def ours_and_kopfs(counts: dict[Call, int]) -> tuple[int, int]:
    """(the operator's own writes, kopf's)."""
    kopf = sum(c for k, c in counts.items() if k in KOPF_WRITES)
    return sum(counts.values()) - kopf, kopf
