"""The writes a user made, as the API server's audit log has them (tools/k8s/cluster.py
keeps one for every ServiceAccount): the operator's API cost per ThrottledJob, split
into its own calls and kopf's by the User-Agent each sends (operator/kube.py names ours;
the events of kopf.info/warn are posted by kopf, and count as its)."""

from __future__ import annotations

from typing import Any

from throttledjob.operator.kube import USER_AGENT

WRITE_VERBS = ("create", "update", "patch", "delete")

Call = tuple[str, str, str, str]  # (API group, resource[/subresource], verb, "ours"|"kopf")
CONFLICT = 409


def writes(cluster: Any, user: str, namespace: str, since: int,
           conflicts: bool = False) -> dict[Call, int]:
    """How many times `user` made each write in `namespace`, after its first `since`
    audited calls: all but those refused as a conflict (409: a write raced by another
    writer, how many depends on the load), or with `conflicts` those only."""
    counts: dict[Call, int] = {}
    for e in cluster.audit(user)[since:]:
        ref = e.get("objectRef") or {}
        if ref.get("namespace") != namespace or e.get("verb") not in WRITE_VERBS:
            continue
        if ((e.get("responseStatus") or {}).get("code") == CONFLICT) != conflicts:
            continue
        by = "ours" if (e.get("userAgent") or "").startswith(USER_AGENT) else "kopf"
        key = (ref.get("apiGroup", ""), ref["resource"] + (
            f"/{ref['subresource']}" if ref.get("subresource") else ""), e["verb"], by)
        counts[key] = counts.get(key, 0) + 1
    return counts


def ours_and_kopfs(counts: dict[Call, int]) -> tuple[int, int]:
    """(the operator's own writes, kopf's)."""
    ours = sum(c for k, c in counts.items() if k[3] == "ours")
    return ours, sum(counts.values()) - ours
