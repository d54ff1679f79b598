"""Attach mode: a ThrottledJob whose `spec.workloadRef` names a workload someone else
made (a Job, a JobSet, a Kubeflow TrainJob), whose pods it throttles as they are
created, by admission (admission.py). Which ThrottledJob a new pod is for, and the patch
that makes it a throttled one: the template mode's own builder (children.inject_pod),
run on the pod itself. Pure functions.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .children import LABEL_NAME, inject_pod
from .config import OperatorSettings

WORKLOAD_REF = "workloadRef"
# How far up a pod's chain of controllers the webhook looks: pod -> Job -> JobSet ->
# TrainJob is three.
MAX_OWNER_DEPTH = 4


@dataclass(frozen=True)
class Owner:
    """One object in a pod's chain of controllers (its controller's, and so on)."""

    api_version: str
    kind: str
    name: str


def group(api_version: str) -> str:
    """The API group of `apiVersion` ("" for the core group's "v1")."""
    return api_version.rpartition("/")[0]


def workload_ref(spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return spec.get(WORKLOAD_REF)


def attached(spec: Mapping[str, Any]) -> bool:
    return WORKLOAD_REF in spec


def refers_to(ref: Mapping[str, Any], owner: Owner) -> bool:
    """Whether `ref` names `owner` (any version of its group: a served version is
    converted, the object is the same)."""
    return (group(str(ref.get("apiVersion", ""))) == group(owner.api_version)
            and ref.get("kind") == owner.kind and ref.get("name") == owner.name)


def controller_of(meta: Mapping[str, Any]) -> Owner | None:
    """The controller in an object's ownerReferences, or None."""
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            return Owner(str(ref.get("apiVersion", "")), str(ref.get("kind", "")),
                         str(ref.get("name", "")))
    return None


def claimants(owners: list[Owner], tjs: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The attached ThrottledJobs (of the pod's namespace) whose workloadRef names one of
    the pod's owners, the oldest first: the oldest claim wins, the others say so."""
    found = [tj for tj in tjs
             if (ref := workload_ref(tj.get("spec") or {})) is not None
             and any(refers_to(ref, o) for o in owners)]
    return sorted(found, key=lambda tj: (tj["metadata"].get("creationTimestamp") or "",
                                         tj["metadata"].get("name") or ""))


def as_template_spec(tj_spec: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> dict[str, Any]:
    """The ThrottledJob's spec as if its template were this pod's: every decision the
    template mode makes from its template (the kernel's quota against the requests, the
    workload's UID) is then made from the pod itself."""
    spec = {k: v for k, v in tj_spec.items() if k != WORKLOAD_REF}
    spec["jobTemplate"] = {"spec": {"template": {"spec": copy.deepcopy(dict(pod_spec))}}}
    return spec


def throttled(pod: Mapping[str, Any]) -> bool:
    """A pod a ThrottledJob's builder made already (template mode, or admitted before)."""
    return LABEL_NAME in ((pod.get("metadata") or {}).get("labels") or {})


def as_template(tj: Mapping[str, Any], pod: Mapping[str, Any]) -> dict[str, Any]:
    """The ThrottledJob as the template mode's builders and checks read it, its template
    the pod's (as_template_spec)."""
    return {"metadata": tj["metadata"], "spec": as_template_spec(tj["spec"], pod["spec"])}


def pod_patch(pod: Mapping[str, Any], body: Mapping[str, Any], policy_doc: Mapping[str, Any],
              settings: OperatorSettings) -> list[dict[str, Any]]:
    """The JSON patch that makes `pod` a throttled pod of the ThrottledJob `body`
    (as_template): inject_pod run on a copy, each changed top-level field of its metadata
    and spec set whole. The pod's automountServiceAccountToken is left as it is: the
    ServiceAccount admission has run already, and the containers added here mount no
    token."""
    made = {"metadata": copy.deepcopy(dict(pod.get("metadata") or {})),
            "spec": copy.deepcopy(dict(pod["spec"]))}
    inject_pod(made, body, policy_doc, settings)
    if "automountServiceAccountToken" not in pod["spec"]:
        made["spec"].pop("automountServiceAccountToken", None)
    ops = []
    for part in ("metadata", "spec"):
        before = pod.get(part) or {}
        for key, value in made[part].items():
            if before.get(key) != value:
                ops.append({"op": "add", "path": f"/{part}/{_escape(key)}", "value": value})
    return ops


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")
