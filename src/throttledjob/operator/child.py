"""The ThrottledJob's child: a batch/v1 Job (`spec.jobTemplate`) or a JobSet
(`spec.jobSetTemplate`, jobset.x-k8s.io/v1alpha2: the object a distributed training job
of several groups of pods is, and what Kubeflow Trainer v2 renders a TrainJob into).
Exactly one of the two (the CRD's rule).

What differs between the two kinds lives here: where the child is in the API, where its
pod templates are, which pods are its own, and its status as a Job's (so one reading of
a status, status.status_from_job, serves both). Pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
# The JobSet controller's label on the Jobs and pods it makes: its JobSet's uid.
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
# The Job controller's label on its pods: its Job's uid.
JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
JOBSET_INDEX_LABEL = "jobset.sigs.k8s.io/job-global-index"
JOBSET_REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"


# Attach mode (spec.workloadRef, attach.py): the kind each workload's status is read
# from: its own, or, for a Kubeflow TrainJob, the JobSet Trainer renders it into, of the
# same name.
STATUS_KINDS = {("batch", "Job"): "Job", ("jobset.x-k8s.io", "JobSet"): "JobSet",
                ("trainer.kubeflow.org", "TrainJob"): "JobSet"}


def group(api_version: str) -> str:
    """The API group of `apiVersion` ("" for the core group's "v1")."""
    return api_version.rpartition("/")[0]


def status_kind(ref: Mapping[str, Any]) -> str | None:
    """The kind (Job or JobSet) an attached ThrottledJob reads its status from, or None
    where attach mode does not read this kind."""
    return STATUS_KINDS.get((group(str(ref.get("apiVersion", ""))), str(ref.get("kind", ""))))


def is_jobset(spec: Mapping[str, Any]) -> bool:
    """Whether the child (made, or attached to) is read as a JobSet."""
    ref = spec.get("workloadRef")
    if ref is not None:
        return status_kind(ref) == "JobSet"
    return "jobSetTemplate" in spec


def kind(spec: Mapping[str, Any]) -> str:
    return "JobSet" if is_jobset(spec) else "Job"


def collection_path(namespace: str, jobset: bool) -> str:
    if jobset:
        return f"/apis/{JOBSET_API}/namespaces/{quote(namespace)}/jobsets"
    return f"/apis/batch/v1/namespaces/{quote(namespace)}/jobs"


def path(namespace: str, name: str, jobset: bool) -> str:
    return f"{collection_path(namespace, jobset)}/{quote(name)}"


def template(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The child's template as the user wrote it: {metadata, spec}."""
    return dict(spec.get("jobSetTemplate") or spec.get("jobTemplate") or {})


def job_specs(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JobSpec of each kind of Job the child runs: the Job's own, or each
    replicatedJob's (its replicas share one)."""
    if not is_jobset(spec):
        return [(spec.get("jobTemplate") or {}).get("spec") or {}]
    return [((r.get("template") or {}).get("spec") or {})
            for r in ((spec.get("jobSetTemplate") or {}).get("spec") or {}).get(
                "replicatedJobs") or []]


def pod_specs(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The spec of each pod template of the child ({} where one is missing)."""
    return [((j.get("template") or {}).get("spec") or {}) for j in job_specs(spec)]


def containers(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The workload containers of every pod template (a name repeated across templates
    is listed once: the first)."""
    out: dict[str, dict[str, Any]] = {}
    for pod in pod_specs(spec):
        for c in pod.get("containers") or []:
            out.setdefault(c.get("name", ""), c)
    return list(out.values())


def pod_groups(spec: Mapping[str, Any]) -> list[tuple[str | None, int, dict[str, Any]]]:
    """Each pod template of the child: (its replicatedJob's name, None for a Job; how
    many of its pods run at once: the Job's parallelism (its default 1), or a
    replicatedJob's replicas (default 1) times its; the pod spec)."""
    def parallelism(job: Mapping[str, Any]) -> int:
        value = job.get("parallelism")
        return value if isinstance(value, int) and value > 0 else 1

    def pod(job: Mapping[str, Any]) -> dict[str, Any]:
        return (job.get("template") or {}).get("spec") or {}

    if not is_jobset(spec):
        job = job_specs(spec)[0]
        return [(None, parallelism(job), pod(job))]
    out = []
    for r in ((spec.get("jobSetTemplate") or {}).get("spec") or {}).get("replicatedJobs") or []:
        replicas, job = r.get("replicas"), (r.get("template") or {}).get("spec") or {}
        out.append((r.get("name"), (replicas if isinstance(replicas, int) and replicas > 0
                                    else 1) * parallelism(job), pod(job)))
    return out


def pods_at_once(spec: Mapping[str, Any]) -> int:
    """How many pods of the child run at once (pod_groups)."""
    return max(sum(count for _, count, _ in pod_groups(spec)), 1)


def pod_containers(spec: Mapping[str, Any], pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The workload containers of the template `pod` was made from: a JobSet's pod by
    its replicatedJob (the JobSet controller's label), where the templates differ (a
    launcher and its workers); else every template's (containers). In attach mode,
    with no template, the pod's own."""
    group = ((pod.get("metadata") or {}).get("labels") or {}).get(JOBSET_REPLICATED_JOB_LABEL)
    groups = pod_groups(spec)
    if not any(pod_spec for _, _, pod_spec in groups):  # attach mode: no template
        return list((pod.get("spec") or {}).get("containers") or [])
    for name, _, pod_spec in groups:
        if name is not None and name == group:
            return list(pod_spec.get("containers") or [])
    return containers(spec)


def pod_belongs(pod: Mapping[str, Any], child_uid: str) -> bool:
    """A pod of the child: owned by the Job, or labelled by the JobSet controller with
    the JobSet's uid (its pods are owned by the JobSet's Jobs)."""
    if any(ref.get("uid") == child_uid
           for ref in (pod.get("metadata") or {}).get("ownerReferences") or []):
        return True
    return ((pod.get("metadata") or {}).get("labels") or {}).get(JOBSET_UID_LABEL) == child_uid


def as_job(child: Mapping[str, Any]) -> dict[str, Any]:
    """The child as a Job's status reads: a Job as it is; a JobSet's conditions Completed
    and Failed as Complete and Failed, its replicated Jobs' active and ready pods summed."""
    if child.get("kind") != "JobSet":
        return dict(child)
    st = child.get("status") or {}
    names = {"Completed": "Complete", "Failed": "Failed", "Suspended": "Suspended"}
    conditions = [{**c, "type": names[c.get("type")]} for c in st.get("conditions") or []
                  if c.get("type") in names]
    replicated = st.get("replicatedJobsStatus") or []
    status: dict[str, Any] = {
        "conditions": conditions,
        "active": sum(int(r.get("active") or 0) for r in replicated),
        "ready": sum(int(r.get("ready") or 0) for r in replicated),
    }
    finished = next((c.get("lastTransitionTime") for c in conditions
                     if c.get("type") in ("Complete", "Failed") and c.get("status") == "True"),
                    None)
    if finished:
        status["completionTime"] = finished
    return {**child, "status": status}
