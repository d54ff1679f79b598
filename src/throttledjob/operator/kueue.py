"""Queued by Kueue: what the operator carries to the Job, and what it reads back.

Kueue queues a Job that carries `kueue.x-k8s.io/queue-name` when the Job's owner is a
kind Kueue does not integrate (a ThrottledJob): the Job becomes a top-level Workload,
which Kueue holds suspended until its ClusterQueue has room. Kueue owns the Job's
`spec.suspend` from then on (it un-suspends an admitted Job that anyone else suspends),
so the operator never writes it on such a Job: its own `spec.suspend` becomes the
Workload's `spec.active` (Kueue's supported stop and resume), and "suspended if either
says so" holds without a fight.

Pure functions of dicts; the handlers and the poller do the calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from . import child

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
CARRIED_LABELS = (QUEUE_LABEL, PRIORITY_LABEL)
# Kueue's label on a Workload: the uid of the Job it was made for.
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
WORKLOADS = "/apis/kueue.x-k8s.io/{version}/namespaces/{namespace}/workloads"
# Kueue serves Workloads at v1beta2 from v0.15, and before only at v1beta1 (Kueue older
# than that answers 404 on v1beta2): the first that answers is used. Both have
# spec.active and the status conditions read here.
WORKLOAD_VERSIONS = ("v1beta2", "v1beta1")


def carried_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    """The Kueue labels of a ThrottledJob that its Job carries."""
    return {k: v for k, v in (labels or {}).items() if k in CARRIED_LABELS}


def label_clash(tj_labels: Mapping[str, str] | None,
                template_labels: Mapping[str, str] | None) -> str | None:
    """Why the ThrottledJob's Kueue labels cannot be carried (the jobTemplate names
    another queue or priority), or None."""
    template = template_labels or {}
    for key, value in carried_labels(tj_labels).items():
        if key in template and template[key] != value:
            return (f"label {key}={value} of the ThrottledJob and {key}={template[key]} of "
                    "spec.jobTemplate.metadata.labels disagree; set it in one place")
    return None


def queued_by_kueue(job: Mapping[str, Any]) -> bool:
    """Kueue admits this Job (it carries a queue name), so Kueue owns its suspend."""
    return bool(((job.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL))


def queued_tj(tj: Mapping[str, Any]) -> bool:
    """Kueue queues this ThrottledJob's child: its template or the ThrottledJob itself
    names a queue (the label the child carries)."""
    template = child.template(tj.get("spec") or {})
    labels = {**((template.get("metadata") or {}).get("labels") or {}),
              **carried_labels((tj.get("metadata") or {}).get("labels"))}
    return bool(labels.get(QUEUE_LABEL))


def workloads_path(namespace: str, version: str = WORKLOAD_VERSIONS[0]) -> str:
    return WORKLOADS.format(version=version, namespace=quote(namespace))


def workload_path(workload: Mapping[str, Any]) -> str:
    """The API path of a Workload, at the version it was read in (its apiVersion)."""
    version = str(workload.get("apiVersion") or "").rpartition("/")[2] or WORKLOAD_VERSIONS[0]
    meta = workload.get("metadata") or {}
    return f"{workloads_path(meta.get('namespace', ''), version)}/{quote(meta.get('name', ''))}"


def workload_query(job_uid: str) -> dict[str, str]:
    return {"labelSelector": f"{JOB_UID_LABEL}={job_uid}"}


def active_patch(workload: Mapping[str, Any], suspend: bool) -> dict[str, Any] | None:
    """The patch that makes the Workload's `spec.active` say what the ThrottledJob's
    `spec.suspend` asks (None: it does already)."""
    active = (workload.get("spec") or {}).get("active", True)
    return None if active is (not suspend) else {"spec": {"active": not suspend}}


def admission(workload: Mapping[str, Any] | None) -> tuple[bool, str, str]:
    """(admitted, reason, message) of a Workload, in Kueue's own words: the Admitted
    condition where it is True, else why quota is not reserved (QuotaReserved False:
    Pending, Inadmissible, ...); a Workload not made yet is Pending."""
    if workload is None:
        return False, "Pending", "Kueue has not made the Workload yet"
    conds = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    admitted = conds.get("Admitted") or {}
    if admitted.get("status") == "True":
        return True, "Admitted", admitted.get("message") or "admitted by Kueue"
    if not (workload.get("spec") or {}).get("active", True):
        return (False, "Deactivated",
                "the Workload is not active (spec.suspend, or a ThrottleBudget)")
    waiting = conds.get("QuotaReserved") or admitted
    return (False, waiting.get("reason") or "Pending",
            waiting.get("message") or "waiting in its queue")
