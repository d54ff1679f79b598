"""Attach mode: a ThrottledJob whose `spec.workloadRef` names a workload someone else
made (a Job, a JobSet, a Kubeflow TrainJob), or whose `spec.labeledWorkloads` takes every
workload labeled `throttledjob.io/throttle: <its name>` (a CronJob's Jobs, the way Kueue's
queue label works), whose pods it throttles as they are created, by admission
(admission.py). Which ThrottledJob a new pod is for, and the patch
that makes it a throttled one: the template mode's own builder (children.inject_pod),
run on the pod itself. Pure functions.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import child, cpu_limits
from .child import group
from .children import LABEL_NAME, inject_pod
from .config import OperatorSettings

WORKLOAD_REF = "workloadRef"
LABELED = "labeledWorkloads"
# On the user's own object (a Job, a CronJob's jobTemplate, a JobSet, a TrainJob, a pod):
# the name of the ThrottledJob, in its namespace, that throttles its pods.
THROTTLE_LABEL = "throttledjob.io/throttle"
# How far up a pod's chain of controllers the webhook looks: pod -> Job -> JobSet ->
# TrainJob is three.
MAX_OWNER_DEPTH = 4


@dataclass(frozen=True)
class Owner:
    """One object in a pod's chain of controllers (its controller's, and so on)."""

    api_version: str
    kind: str
    name: str


@dataclass
class Chain:
    """A new pod's chain of controllers as the webhook read it."""

    owners: list[Owner]
    objects: list[Mapping[str, Any]]  # the owners read, in the same order
    named: str | None  # the first throttle label on the pod or an owner

    def ranks(self, tj: Mapping[str, Any]) -> int:
        """How many pods of the workload `tj` names run at once, which scope Job splits
        its target among: its Job's parallelism, or its JobSet's pods (a TrainJob's
        JobSet has its name); 1 where that object was not read (the split then moves
        the pods to their shares at its first read)."""
        ref = workload_ref(tj.get("spec") or {})
        kind = child.status_kind(ref) if ref else None
        for obj in self.objects:
            if kind and obj.get("kind") == kind and \
                    (obj.get("metadata") or {}).get("name") == ref["name"]:
                key = "jobSetTemplate" if kind == "JobSet" else "jobTemplate"
                return child.pods_at_once({key: {"spec": obj.get("spec") or {}}})
        return 1


def workload_ref(spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return spec.get(WORKLOAD_REF)


def labeled(spec: Mapping[str, Any]) -> bool:
    return LABELED in spec


def attached(spec: Mapping[str, Any]) -> bool:
    return WORKLOAD_REF in spec or LABELED in spec


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


def claimants(owners: list[Owner], named: str | None,
              tjs: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The attached ThrottledJobs (of the pod's namespace) that claim the pod: a
    workloadRef naming one of its owners, or labeledWorkloads where the pod or an owner
    is labeled with the ThrottledJob's name (`named`). The oldest first: the oldest claim
    wins, the others say so."""
    def claims(tj: Mapping[str, Any]) -> bool:
        spec = tj.get("spec") or {}
        if labeled(spec):
            return named is not None and tj["metadata"].get("name") == named
        ref = workload_ref(spec)
        return ref is not None and any(refers_to(ref, o) for o in owners)

    return sorted(filter(claims, tjs), key=lambda tj: (
        tj["metadata"].get("creationTimestamp") or "", tj["metadata"].get("name") or ""))


def throttle_label(meta: Mapping[str, Any] | None) -> str | None:
    return ((meta or {}).get("labels") or {}).get(THROTTLE_LABEL)


def defaulted_requests(pod_spec: Mapping[str, Any]) -> set[str]:
    """The containers whose CPU request equals their CPU limit: what the API server makes
    of a template that gives a limit alone (it defaults the request to the limit before
    any webhook sees the pod). Such a request follows the limit the throttle sets, as it
    would have from the template mode's Job; a request the user set under the limit
    stays."""
    def cpu(c: Mapping[str, Any], kind: str) -> Any:
        return ((c.get("resources") or {}).get(kind) or {}).get("cpu")

    return {c.get("name", "") for c in pod_spec.get("containers") or []
            if cpu(c, "limits") is not None
            and cpu_limits.cores(cpu(c, "requests")) == cpu_limits.cores(cpu(c, "limits"))}


def as_template_spec(tj_spec: Mapping[str, Any], pod_spec: Mapping[str, Any],
                     ranks: int = 1) -> dict[str, Any]:
    """The ThrottledJob's spec as if its template were this pod's (its defaulted CPU
    requests left out, as a template has them), run `ranks` at once: every decision the
    template mode makes from its template (the kernel's quota against the requests, the
    workload's UID, scope Job's even share) is then made from the pod itself."""
    spec = {k: v for k, v in tj_spec.items() if k not in (WORKLOAD_REF, LABELED)}
    template = copy.deepcopy(dict(pod_spec))
    defaulted = defaulted_requests(pod_spec)
    for c in template.get("containers") or []:
        if c.get("name") in defaulted:
            c["resources"]["requests"].pop("cpu")
    spec["jobTemplate"] = {"spec": {"parallelism": ranks, "template": {"spec": template}}}
    return spec


def throttled(pod: Mapping[str, Any]) -> bool:
    """A pod a ThrottledJob's builder made already (template mode, or admitted before)."""
    return LABEL_NAME in ((pod.get("metadata") or {}).get("labels") or {})


def as_template(tj: Mapping[str, Any], pod: Mapping[str, Any],
                ranks: int = 1) -> dict[str, Any]:
    """The ThrottledJob as the template mode's builders and checks read it, its template
    the pod's (as_template_spec)."""
    return {"metadata": tj["metadata"],
            "spec": as_template_spec(tj["spec"], pod["spec"], ranks)}


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
    defaulted = defaulted_requests(pod["spec"])
    for c in made["spec"]["containers"]:
        if c.get("name") in defaulted:
            c["resources"]["requests"]["cpu"] = c["resources"]["limits"]["cpu"]
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
