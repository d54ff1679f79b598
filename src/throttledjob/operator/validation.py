"""Whether the operator runs a ThrottledJob: what passes the CRD's schema but cannot work
or must not run is refused with a reason (SpecError), before anything is created.

Pure functions; the policy itself is checked by the sidecar's own parser, so the operator
refuses exactly what the sidecar would refuse.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

from throttledjob.contracts.names import (
    ENV_CONTAINER,
    ENV_DIR,
    ENV_USER_PYTHONPATH,
    NODE_CSI_DRIVER,
)
from throttledjob.contracts.policy import Choice, PolicyError, parse_cpu_quantity, parse_policy

from . import child, cpu_limits, job_split, quota
from .api_names import (
    INJECT_VOLUME,
    MAX_NAME_LENGTH,
    MAX_RANKS,
    NODE_AGENT_VOLUME,
    POLICY_VOLUME,
    RESERVED_CONTAINERS,
    SHARED_VOLUME,
)
from .attach import WORKLOAD_REF, attached
from .children import (
    DEFAULT_SIDECAR_UID,
    METRICS_PORT,
    POLICY_DIR,
    SHARED_DIR,
    workload_uid,
)
from .inject import INJECT_DIR
from .kueue import label_clash
from .spec_rules import broken_spec, broken_throttle

GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")


class Refusal(Choice):
    """Why a spec is refused: the reason of the Failed condition and the Warning event."""

    INVALID_NAME = "InvalidName"
    INVALID_JOB_TEMPLATE = "InvalidJobTemplate"
    INVALID_PARAMETER = "InvalidParameter"
    INVALID_POLICY = "InvalidPolicy"
    NAME_CLASH = "NameClash"
    MOUNT_PATH_CLASH = "MountPathClash"
    ENV_CLASH = "EnvClash"
    PORT_CLASH = "PortClash"
    VOLUME_CLASH = "VolumeClash"
    PROCESS_NAMESPACE_REQUIRED = "ProcessNamespaceRequired"
    HOST_ACCESS_REFUSED = "HostAccessRefused"
    UNREACHABLE_TARGET = "UnreachableTarget"
    LABEL_CLASH = "LabelClash"
    JOBSETS_OFF = "JobSetSupportOff"
    # Found when creating: an object of the child's name exists and is not ours.
    CONFIG_MAP_NAME_TAKEN = "ConfigMapNameTaken"
    JOB_NAME_TAKEN = "JobNameTaken"


class SpecError(ValueError):
    """A ThrottledJob the operator refuses; `reason` is the condition/event reason."""

    def __init__(self, reason: Refusal, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def parameter_values(parameters: Mapping[str, Any] | None) -> dict[str, Any]:
    """`{name: value}` from `spec.parameters`, each checked against its type and bounds."""
    values: dict[str, Any] = {}
    for name, decl in (parameters or {}).items():
        kind, value = decl.get("type"), decl.get("value")
        where = f"parameters.{name}"
        ok = {"Integer": isinstance(value, int) and not isinstance(value, bool),
              "Number": isinstance(value, (int, float)) and not isinstance(value, bool)
              and math.isfinite(value),
              "Boolean": isinstance(value, bool),
              "String": isinstance(value, str)}.get(kind, False)
        if not ok:
            raise SpecError(Refusal.INVALID_PARAMETER,
                            f"{where}: value {str(value)[:40]!r} is not a finite {kind}")
        low, high = decl.get("min"), decl.get("max")
        if low is not None and value < low:
            raise SpecError(Refusal.INVALID_PARAMETER,
                            f"{where}: value {value} is below min {low}")
        if high is not None and value > high:
            raise SpecError(Refusal.INVALID_PARAMETER,
                            f"{where}: value {value} is above max {high}")
        choices = decl.get("choices")
        if choices is not None and value not in choices:
            raise SpecError(Refusal.INVALID_PARAMETER,
                            f"{where}: value {value!r} is not one of {choices}")
        values[name] = value
    return values


def policy_document(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The sidecar's policy: `spec.throttle` plus the parameter values under `parameters`.

    Validated by the sidecar's own parser, so the operator refuses exactly what the
    sidecar would refuse (one implementation of the rules)."""
    doc = copy.deepcopy(dict(spec.get("throttle") or {}))
    # `inject` shapes the pod and `scope` how the pods' limits are split, both the
    # operator's: the sidecar never reads them.
    doc.pop("inject", None)
    doc.pop("scope", None)
    if "parameters" in doc:
        raise SpecError(Refusal.INVALID_POLICY, "throttle.parameters is not a field: "
                                                "declare tunables in spec.parameters")
    values = parameter_values(spec.get("parameters"))
    if values:
        doc["parameters"] = values
    try:
        parse_policy(doc)
    except PolicyError as e:
        raise SpecError(Refusal.INVALID_POLICY, f"throttle: {e}") from None
    return doc


def _cpu_limit_cores(containers: list[Mapping[str, Any]]) -> float | None:
    """The pod's CPU limit in cores, or None when a container has no limit."""
    total = 0.0
    for c in containers:
        limit = c.get("resources", {}).get("limits", {}).get("cpu")
        if limit is None:
            return None
        try:
            total += parse_cpu_quantity(limit, "limit")
        except PolicyError:
            return None
    return total


def validate(body: Mapping[str, Any], allow_host_access: bool = False,
             jobsets: bool = False) -> dict[str, Any]:
    """The policy document of a ThrottledJob, or SpecError for what passes the CRD's
    schema but cannot work or must not run: a bad policy, names the sidecar needs, a
    target the pod cannot reach, host access (unless allowed), a JobSet (unless the
    operator runs with JobSet support)."""
    name = body.get("metadata", {}).get("name", "")
    if len(name) > MAX_NAME_LENGTH:
        raise SpecError(Refusal.INVALID_NAME,
                        f"the name is longer than {MAX_NAME_LENGTH} characters")
    spec = body.get("spec") or {}
    # The CRD's own rules (spec_rules.py), again for an object the server stored without.
    why = broken_spec(spec)
    if why:
        raise SpecError(Refusal.INVALID_JOB_TEMPLATE, why)
    if attached(spec):
        return _attached_policy(spec, body.get("metadata", {}).get("namespace"), jobsets)
    if child.is_jobset(spec) and not jobsets:
        raise SpecError(Refusal.JOBSETS_OFF, "spec.jobSetTemplate needs the operator's "
                                             "JobSet support: the chart value "
                                             "jobset.enabled=true (THROTTLEDJOB_JOBSETS)")
    pods = child.pod_specs(spec)
    if not pods:
        raise SpecError(Refusal.INVALID_JOB_TEMPLATE,
                        "jobSetTemplate.spec.replicatedJobs is empty")
    why = broken_throttle(spec.get("throttle") or {})
    if why:
        raise SpecError(Refusal.INVALID_POLICY, why)
    doc = policy_document(spec)
    clash = label_clash(body.get("metadata", {}).get("labels"),
                        (child.template(spec).get("metadata") or {}).get("labels"))
    if clash:
        raise SpecError(Refusal.LABEL_CLASH, clash)
    for pod in pods:
        _check_pod(pod, allow_host_access)
    _check_split(spec, doc)
    for pod in pods:
        _check_reachable(spec, doc, pod.get("containers") or [])
    return doc


def _attached_policy(spec: Mapping[str, Any], namespace: str | None,
                     jobsets: bool) -> dict[str, Any]:
    """Attach mode: the throttle alone; each pod is checked as the webhook admits it
    (admission.review), against this same function with the pod as the template."""
    ref = spec.get(WORKLOAD_REF)
    if ref is not None:  # else labeledWorkloads: each pod's own workload, of any kind
        _check_reference(ref, namespace, child.is_jobset(spec) and not jobsets)
    why = broken_throttle(spec.get("throttle") or {})
    if why:
        raise SpecError(Refusal.INVALID_POLICY, why)
    return policy_document(spec)


def _check_reference(ref: Mapping[str, Any], namespace: str | None,
                     jobsets_off: bool) -> None:
    if ref.get("namespace") not in (None, namespace):
        raise SpecError(Refusal.INVALID_JOB_TEMPLATE, f"workloadRef: a ThrottledJob attaches "
                        f"only to a workload in its own namespace ({namespace}), not "
                        f"{ref['namespace']}")
    if child.status_kind(ref) is None:
        raise SpecError(Refusal.INVALID_JOB_TEMPLATE, f"workloadRef: attach mode reads the "
                        f"status of a Job, a JobSet or a TrainJob (trainer.kubeflow.org), "
                        f"not of {ref.get('apiVersion')} {ref.get('kind')}")
    if jobsets_off:
        raise SpecError(Refusal.JOBSETS_OFF, f"workloadRef to a {ref.get('kind')} needs the "
                                             "operator's JobSet support: the chart value "
                                             "jobset.enabled=true (THROTTLEDJOB_JOBSETS)")


def _check_pod(pod: Mapping[str, Any], allow_host_access: bool) -> None:
    """One pod template: what the operator adds must not clash with what it has."""
    containers = pod.get("containers") or []
    if not containers:
        raise SpecError(Refusal.INVALID_JOB_TEMPLATE,
                        "a pod template's containers are empty")
    init = pod.get("initContainers") or []
    if not allow_host_access:
        _refuse_host_access(pod, [*containers, *init])
    for c in [*containers, *init]:
        cname = c.get("name")
        if cname in RESERVED_CONTAINERS:
            raise SpecError(Refusal.NAME_CLASH, f"container name {cname} is reserved for the "
                                                "injected sidecar and init container")
        for m in c.get("volumeMounts") or []:
            if m.get("mountPath", "").rstrip("/") in (SHARED_DIR, POLICY_DIR, INJECT_DIR):
                raise SpecError(Refusal.MOUNT_PATH_CLASH,
                                f"container {cname} mounts {m.get('mountPath')}, which the "
                                "operator uses for the throttle files")
        for e in c.get("env") or []:
            if e.get("name") in (ENV_DIR, ENV_CONTAINER, ENV_USER_PYTHONPATH):
                raise SpecError(Refusal.ENV_CLASH, f"container {cname} sets {e.get('name')}, "
                                                   "which the operator sets")
        for p in c.get("ports") or []:
            if p.get("containerPort") == METRICS_PORT:
                raise SpecError(Refusal.PORT_CLASH, f"container {cname} uses port "
                                                    f"{METRICS_PORT}, the sidecar's metrics port")
    if pod.get("shareProcessNamespace") is False:
        raise SpecError(Refusal.PROCESS_NAMESPACE_REQUIRED,
                        "shareProcessNamespace: false hides the workload from the sidecar, "
                        "which measures it; remove the field")
    for v in pod.get("volumes") or []:
        if v.get("name") in (SHARED_VOLUME, POLICY_VOLUME, INJECT_VOLUME, NODE_AGENT_VOLUME):
            raise SpecError(Refusal.VOLUME_CLASH, f"volume name {v.get('name')} is reserved "
                                                  "for the operator's volumes")
        # The agent caps a GPU where this volume says so: it is the operator's to write,
        # from levers.gpuPowerLimit, also where no admission policy refuses it.
        if (v.get("csi") or {}).get("driver") == NODE_CSI_DRIVER:
            raise SpecError(Refusal.VOLUME_CLASH,
                            f"volume {v.get('name')} names the GPU node agent's driver "
                            f"{NODE_CSI_DRIVER}, which the operator mounts itself")


def _check_split(spec: Mapping[str, Any], doc: Mapping[str, Any]) -> None:
    """scope Job: the parallelism in range (the CRD's rule, again for a server that skipped
    it), and a target every pod's floor fits in (spec_rules.py holds the rest)."""
    if not job_split.job_scoped(spec):
        return
    target = cpu_limits.quota_target(doc) or 0.0
    ranks = child.pods_at_once(spec)
    if ranks > MAX_RANKS:
        raise SpecError(Refusal.INVALID_JOB_TEMPLATE, f"scope Job splits its target among "
                                                      f"at most {MAX_RANKS} pods, not {ranks}")
    # Each template's pods need their own floor (a launcher's requests are not its
    # workers').
    groups = [(count, pod.get("containers") or []) for _, count, pod in child.pod_groups(spec)]
    floors = [(count, job_split.rank_floor(containers)) for count, containers in groups]
    need = sum(count * floor for count, floor in floors)
    if target + 1e-9 < need:
        raise SpecError(Refusal.UNREACHABLE_TARGET,
                        f"targets.cpu.peak {target:g} cores is under the {need:g} cores its "
                        f"{ranks} pods need at least "
                        f"({', '.join(f'{count} x {floor:g}' for count, floor in floors)}: "
                        f"their CPU requests, or {job_split.MIN_RANK_CORES:g} each)")
    # Where scope Pod falls back to signals (quota_warning), scope Job has no lever: each
    # sidecar would hold its pod to the whole job-wide figure.
    for _, containers in groups:
        why = cpu_limits.request_over_limit(containers, target / ranks)
        if why:
            raise SpecError(Refusal.UNREACHABLE_TARGET,
                            f"scope Job holds its target by the pods' CPU limits, which "
                            f"cannot be set at each pod's even share: {why}")


def _refuse_host_access(pod: Mapping[str, Any], containers: list[Mapping[str, Any]]) -> None:
    """The operator creates the Job with its own rights: host access would reach the
    node through it (and with hostPID the sidecar would take the node's processes for the
    workload). The chart's admission policy refuses the same before it is stored."""
    for key in ("hostPID", "hostIPC", "hostNetwork"):
        if pod.get(key):
            raise SpecError(Refusal.HOST_ACCESS_REFUSED, f"{key}: true is refused (operator "
                                                         "setting THROTTLEDJOB_ALLOW_HOST_ACCESS)")
    for c in containers:
        if (c.get("securityContext") or {}).get("privileged"):
            raise SpecError(Refusal.HOST_ACCESS_REFUSED,
                            f"container {c.get('name')} is privileged, which is refused "
                            "(operator setting THROTTLEDJOB_ALLOW_HOST_ACCESS)")


def _check_reachable(spec: Mapping[str, Any], doc: Mapping[str, Any],
                     containers: list[Mapping[str, Any]]) -> None:
    """A pod's limit against its own target: under scope Job its even share, not the
    job-wide figure (job_split.pod_target)."""
    targets = doc.get("targets") or {}
    peak = (targets.get("cpu") or {}).get("peak")
    limit = _cpu_limit_cores(containers)
    if peak is not None and limit is not None:
        cores = job_split.pod_target(spec, parse_cpu_quantity(peak, "targets.cpu.peak")) or 0.0
        if cores > limit:
            # The kernel already caps the pod below the target: it can never bind and the
            # user probably meant something else.
            pods = child.pods_at_once(spec) if job_split.job_scoped(spec) else 1
            each = f"{cores:g} cores for each of {pods} pods" if pods > 1 else f"{cores:g} cores"
            raise SpecError(Refusal.UNREACHABLE_TARGET,
                            f"targets.cpu.peak {peak} ({each}) exceeds the pod's CPU "
                            f"limit of {limit:g} cores; the target would never apply")
    gpu = targets.get("gpu") or {}
    if gpu and not any(c.get("resources", {}).get("limits", {}).get(r)
                       for c in containers for r in GPU_RESOURCES):
        raise SpecError(Refusal.UNREACHABLE_TARGET, "targets.gpu is set but no container has "
                                                    f"a GPU limit ({', '.join(GPU_RESOURCES)})")



def quota_warning(body: Mapping[str, Any], policy_doc: Mapping[str, Any]) -> str | None:
    """Why enforcement Quota falls back to signals for this template, or None."""
    why = quota.why_not(body.get("spec") or {}, policy_doc)
    return (f"enforcement Quota: no CPU limit set, {why}; the sidecar holds the target "
            "with signals instead. Lower the request to use the kernel's quota.") if why \
        else None


def signals_uid_warning(body: Mapping[str, Any], policy_doc: Mapping[str, Any]) -> str | None:
    """Why Signals may fail for this template, or None."""
    if (not parse_policy(dict(policy_doc)).uses_signals
            or all(workload_uid(pod) is not None
                   for pod in child.pod_specs(body.get("spec") or {}))):
        return None
    return ("enforcement needs signals but the template does not set one runAsUser for "
            f"all containers; the sidecar runs as {DEFAULT_SIDECAR_UID} and can signal only "
            "processes of that UID. Set securityContext.runAsUser in the pod template.")
