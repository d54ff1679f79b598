"""The schema of the ThrottledJob's `spec.jobTemplate` and `spec.jobSetTemplate`: what
the operator reads of a Job or JobSet template (the rest is kept as written) and the
names a user's template must not take (crd.py assembles the CRD)."""

from __future__ import annotations

from typing import Any

from .api_names import RESERVED_CONTAINERS


def rule(rule: str, message: str) -> dict[str, str]:
    return {"rule": rule, "message": message}


def string_map(description: str) -> dict[str, Any]:
    return {"type": "object", "description": description,
            "additionalProperties": {"type": "string"}}


def job_template_schema() -> dict[str, Any]:
    """`spec.jobTemplate`, as in CronJob. The JobSpec itself is validated by the API
    server when the operator creates the Job; here only what the operator relies on."""
    container = {
        "type": "object", "required": ["name"], "x-kubernetes-preserve-unknown-fields": True,
        "properties": {"name": {"type": "string", "maxLength": 63}},
    }
    no_sidecar_name = rule(
        "self.all(c, " + " && ".join(f"c.name != '{n}'" for n in RESERVED_CONTAINERS) + ")",
        f"the container names {' and '.join(RESERVED_CONTAINERS)} are reserved for the "
        "injected sidecar and init container")
    pod_spec = {
        "type": "object", "required": ["containers", "restartPolicy"],
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {
            "containers": {"type": "array", "minItems": 1, "maxItems": 64, "items": container,
                           "x-kubernetes-validations": [no_sidecar_name]},
            "initContainers": {"type": "array", "maxItems": 64, "items": container,
                               "x-kubernetes-validations": [no_sidecar_name]},
            "restartPolicy": {"type": "string", "enum": ["Never", "OnFailure"],
                              "description": "A Job's pods restart Never or OnFailure."},
        },
    }
    return {
        "type": "object",
        "description": "The Job to run, as in a CronJob's jobTemplate: metadata and a "
                       "batch/v1 JobSpec. The operator adds the sidecar; the rest is kept.",
        "required": ["spec"],
        "properties": {
            "metadata": _template_metadata("Job"),
            "spec": _job_spec(pod_spec),
        },
    }


def _template_metadata(kind: str) -> dict[str, Any]:
    return {"type": "object", "properties": {
        "labels": string_map(f"Labels of the {kind}."),
        "annotations": string_map(f"Annotations of the {kind}."),
    }}


def _job_spec(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """A batch/v1 JobSpec: what the operator reads of it; the API server checks the rest
    when the Job is made."""
    return {
        "type": "object", "required": ["template"],
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {
            "template": {
                "type": "object", "required": ["spec"],
                "x-kubernetes-preserve-unknown-fields": True,
                "properties": {"spec": pod_spec},
            },
            # Read by a rule of scope Job (openapi_schema).
            "parallelism": {"type": "integer", "format": "int32", "minimum": 0},
        },
    }


def jobset_template_schema() -> dict[str, Any]:
    """`spec.jobSetTemplate`: a JobSet (jobset.x-k8s.io/v1alpha2) to run instead of a
    Job; each replicatedJob's pods get the sidecar. The JobSet's own webhook checks the
    rest when the operator makes it."""
    job = job_template_schema()["properties"]["spec"]
    return {
        "type": "object",
        "description": "The JobSet to run (jobset.x-k8s.io/v1alpha2: metadata and a "
                       "JobSetSpec), instead of jobTemplate: groups of Jobs, as a "
                       "distributed training job runs. The operator adds the sidecar to "
                       "every pod template; the rest is kept. Needs JobSet installed.",
        "required": ["spec"],
        "properties": {
            "metadata": _template_metadata("JobSet"),
            "spec": {
                "type": "object", "required": ["replicatedJobs"],
                "x-kubernetes-preserve-unknown-fields": True,
                "properties": {"replicatedJobs": {
                    "type": "array", "minItems": 1, "maxItems": 16,
                    "items": {
                        "type": "object", "required": ["name", "template"],
                        "x-kubernetes-preserve-unknown-fields": True,
                        "properties": {
                            "name": {"type": "string", "maxLength": 63},
                            "replicas": {"type": "integer", "format": "int32", "minimum": 0},
                            "template": {
                                "type": "object", "required": ["spec"],
                                "x-kubernetes-preserve-unknown-fields": True,
                                "properties": {"spec": job},
                            },
                        },
                    },
                }},
            },
        },
    }


def workload_ref_schema() -> dict[str, Any]:
    """Attach mode (operator/attach.py): the workload whose pods are throttled as they are
    made. In the ThrottledJob's own namespace (a namespace named is refused unless it is
    that one: validation.py, and the chart's admission policy)."""
    return {
        "type": "object",
        "description": "Attach to a workload someone else made, in this namespace: its "
                       "pods are throttled as they are created (the operator's admission "
                       "webhook), the workload itself left as it is. Job, JobSet and "
                       "Kubeflow TrainJob report their status here; any kind whose pods "
                       "carry it in their owner chain is throttled.",
        "required": ["apiVersion", "kind", "name"],
        "x-kubernetes-validations": [rule("self == oldSelf", "workloadRef cannot be "
                                          "changed: make a new ThrottledJob")],
        "properties": {
            "apiVersion": {"type": "string", "maxLength": 253,
                           "description": "e.g. batch/v1, jobset.x-k8s.io/v1alpha2, "
                                          "trainer.kubeflow.org/v1alpha1"},
            "kind": {"type": "string", "maxLength": 63,
                     "description": "e.g. Job, JobSet, TrainJob"},
            "name": {"type": "string", "maxLength": 253,
                     "description": "The workload's name, in this namespace."},
            # Declared so that naming another namespace is refused, not pruned away
            # (which would attach to a workload of the same name here).
            "namespace": {"type": "string", "maxLength": 63,
                          "description": "Optional: this ThrottledJob's own namespace; "
                                         "any other is refused."},
        },
    }


def labeled_workloads_schema() -> dict[str, Any]:
    """Attach mode by label (operator/attach.py): every workload of the namespace that
    carries the ThrottledJob's name in its throttle label, the way Kueue's queue label
    works. Empty: the label itself says which."""
    return {
        "type": "object",
        "description": "Attach to every workload in this namespace labeled "
                       "throttledjob.io/throttle: <this ThrottledJob's name> (a Job, a "
                       "CronJob's jobTemplate, a JobSet, a TrainJob, a pod): their pods "
                       "are throttled as they are created. Write it as {}.",
        "x-kubernetes-validations": [rule("self == oldSelf", "labeledWorkloads cannot be "
                                          "changed: make a new ThrottledJob")],
    }
