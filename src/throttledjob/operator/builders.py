"""Pure functions from a ThrottledJob to the objects the operator writes.

No Kubernetes API calls here: each builder takes dicts and returns dicts, so each is unit
tested and its output validated against the official schemas (tests/operator). The kopf
handlers (handlers.py) only call these, adopt the result and send it.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from throttledjob.contracts.names import ENV_DIR, ENV_USER_PYTHONPATH
from throttledjob.contracts.policy import PolicyError, parse_cpu_quantity, parse_policy

from .crd import (
    API_VERSION,
    DEFAULT_INJECT,
    INJECT_CONTAINER,
    INJECT_VOLUME,
    KIND,
    MAX_NAME_LENGTH,
    POLICY_VOLUME,
    RESERVED_CONTAINERS,
    SHARED_VOLUME,
    SIDECAR_CONTAINER,
)

SHARED_DIR = "/var/run/throttledjob"
POLICY_DIR = "/etc/throttledjob"
POLICY_KEY = "policy.yaml"
# Zero-code injection (spec.throttle.inject: Auto): where the runtime library lands.
INJECT_DIR = "/opt/throttledjob/python"
# A user's PYTHONPATH given by valueFrom moves here, and PYTHONPATH expands it.
METRICS_PORT = 9400
METRICS_PORT_NAME = "metrics"
LABEL_NAME = "throttledjob.io/name"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "throttledjob-operator"
# The sidecar image's non-root user, used when the workload's UID is unknown.
DEFAULT_SIDECAR_UID = 65532
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")


class SpecError(ValueError):
    """A ThrottledJob the operator refuses; `reason` is the condition/event reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class OperatorSettings:
    """What the operator injects; every field has an environment variable (from_env)."""

    sidecar_image: str = "ghcr.io/throttledjob/throttledjob:0.1.0"
    sidecar_cpu_request: str = "50m"
    sidecar_memory_request: str = "64Mi"
    sidecar_memory_limit: str = "128Mi"
    shared_dir_size_limit: str = "16Mi"
    inject_dir_size_limit: str = "32Mi"
    status_interval_seconds: float = 10.0
    status_timeout_seconds: float = 2.0
    # Each API call of the operator's own (kopf has its own settings for its calls).
    api_timeout_seconds: float = 10.0
    # Level-triggered safety net: re-read each unfinished ThrottledJob's Job this often,
    # so a Job event lost to an API failure or a restart still reaches the status.
    resync_seconds: float = 60.0
    # Threads running the (blocking) handlers; kopf's default is 6 on 2 cores.
    handler_threads: int = 32
    # hostPID, hostIPC, hostNetwork and privileged containers in a ThrottledJob's pod.
    allow_host_access: bool = False
    extra_pod_labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorSettings:
        env = os.environ if env is None else env
        names = {"sidecar_image": "THROTTLEDJOB_SIDECAR_IMAGE",
                 "sidecar_cpu_request": "THROTTLEDJOB_SIDECAR_CPU_REQUEST",
                 "sidecar_memory_request": "THROTTLEDJOB_SIDECAR_MEMORY_REQUEST",
                 "sidecar_memory_limit": "THROTTLEDJOB_SIDECAR_MEMORY_LIMIT",
                 "shared_dir_size_limit": "THROTTLEDJOB_SHARED_DIR_SIZE_LIMIT",
                 "inject_dir_size_limit": "THROTTLEDJOB_INJECT_DIR_SIZE_LIMIT"}
        values: dict[str, Any] = {attr: env[var] for attr, var in names.items() if env.get(var)}
        for attr, var in (("status_interval_seconds", "THROTTLEDJOB_STATUS_INTERVAL"),
                          ("status_timeout_seconds", "THROTTLEDJOB_STATUS_TIMEOUT"),
                          ("api_timeout_seconds", "THROTTLEDJOB_API_TIMEOUT"),
                          ("resync_seconds", "THROTTLEDJOB_RESYNC_INTERVAL")):
            if env.get(var):
                values[attr] = float(env[var])
        if env.get("THROTTLEDJOB_ALLOW_HOST_ACCESS"):
            values["allow_host_access"] = env["THROTTLEDJOB_ALLOW_HOST_ACCESS"] == "true"
        if env.get("THROTTLEDJOB_HANDLER_THREADS"):
            values["handler_threads"] = int(env["THROTTLEDJOB_HANDLER_THREADS"])
        return cls(**values)


# --- names -------------------------------------------------------------------------------

def job_name(tj_name: str) -> str:
    """The Job is named after its ThrottledJob, so `kubectl get job NAME` finds it."""
    return tj_name


def configmap_name(tj_name: str) -> str:
    return f"{tj_name}-throttle"


# --- validation --------------------------------------------------------------------------

def _pod_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    return spec.get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec", {})


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
            raise SpecError("InvalidParameter",
                            f"{where}: value {str(value)[:40]!r} is not a finite {kind}")
        low, high = decl.get("min"), decl.get("max")
        if low is not None and value < low:
            raise SpecError("InvalidParameter", f"{where}: value {value} is below min {low}")
        if high is not None and value > high:
            raise SpecError("InvalidParameter", f"{where}: value {value} is above max {high}")
        choices = decl.get("choices")
        if choices is not None and value not in choices:
            raise SpecError("InvalidParameter", f"{where}: value {value!r} is not one of "
                                                f"{choices}")
        values[name] = value
    return values


def policy_document(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The sidecar's policy: `spec.throttle` plus the parameter values under `parameters`.

    Validated by the sidecar's own parser, so the operator refuses exactly what the
    sidecar would refuse (one implementation of the rules)."""
    doc = copy.deepcopy(dict(spec.get("throttle") or {}))
    # `inject` shapes the pod, which the operator builds; the sidecar never reads it.
    doc.pop("inject", None)
    if "parameters" in doc:
        raise SpecError("InvalidPolicy", "throttle.parameters is not a field: declare "
                                         "tunables in spec.parameters")
    values = parameter_values(spec.get("parameters"))
    if values:
        doc["parameters"] = values
    try:
        parse_policy(doc)
    except PolicyError as e:
        raise SpecError("InvalidPolicy", f"throttle: {e}") from None
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


def validate(body: Mapping[str, Any], allow_host_access: bool = False) -> dict[str, Any]:
    """The policy document of a ThrottledJob, or SpecError for what passes the CRD's
    schema but cannot work or must not run: a bad policy, names the sidecar needs, a
    target the pod cannot reach, host access (unless allowed)."""
    name = body.get("metadata", {}).get("name", "")
    if len(name) > MAX_NAME_LENGTH:
        raise SpecError("InvalidName", f"the name is longer than {MAX_NAME_LENGTH} characters")
    spec = body.get("spec") or {}
    pod = _pod_spec(spec)
    containers = pod.get("containers") or []
    if not containers:
        raise SpecError("InvalidJobTemplate", "jobTemplate.spec.template.spec.containers "
                                              "is empty")
    doc = policy_document(spec)
    init = pod.get("initContainers") or []
    if not allow_host_access:
        _refuse_host_access(pod, [*containers, *init])
    for c in [*containers, *init]:
        cname = c.get("name")
        if cname in RESERVED_CONTAINERS:
            raise SpecError("NameClash", f"container name {cname} is reserved for the "
                                         "injected sidecar and init container")
        for m in c.get("volumeMounts") or []:
            if m.get("mountPath", "").rstrip("/") in (SHARED_DIR, POLICY_DIR, INJECT_DIR):
                raise SpecError("MountPathClash", f"container {cname} mounts "
                                                  f"{m.get('mountPath')}, which the operator "
                                                  "uses for the throttle files")
        for e in c.get("env") or []:
            if e.get("name") in (ENV_DIR, ENV_USER_PYTHONPATH):
                raise SpecError("EnvClash", f"container {cname} sets {e.get('name')}, which "
                                            "the operator sets")
        for p in c.get("ports") or []:
            if p.get("containerPort") == METRICS_PORT:
                raise SpecError("PortClash", f"container {cname} uses port {METRICS_PORT}, "
                                             "the sidecar's metrics port")
    if pod.get("shareProcessNamespace") is False:
        raise SpecError("ProcessNamespaceRequired", "shareProcessNamespace: false hides the "
                                                    "workload from the sidecar, which measures "
                                                    "it; remove the field")
    for v in pod.get("volumes") or []:
        if v.get("name") in (SHARED_VOLUME, POLICY_VOLUME, INJECT_VOLUME):
            raise SpecError("VolumeClash", f"volume name {v.get('name')} is reserved for the "
                                           "operator's volumes")
    _check_reachable(doc, containers)
    return doc


def _refuse_host_access(pod: Mapping[str, Any], containers: list[Mapping[str, Any]]) -> None:
    """The operator creates the Job with its own rights: host access would reach the
    node through it (and with hostPID the sidecar would take the node's processes for the
    workload). The chart's admission policy refuses the same before it is stored."""
    for key in ("hostPID", "hostIPC", "hostNetwork"):
        if pod.get(key):
            raise SpecError("HostAccessRefused", f"{key}: true is refused (operator setting "
                                                 "THROTTLEDJOB_ALLOW_HOST_ACCESS)")
    for c in containers:
        if (c.get("securityContext") or {}).get("privileged"):
            raise SpecError("HostAccessRefused", f"container {c.get('name')} is privileged, "
                            "which is refused (operator setting THROTTLEDJOB_ALLOW_HOST_ACCESS)")


def _check_reachable(doc: Mapping[str, Any], containers: list[Mapping[str, Any]]) -> None:
    targets = doc.get("targets") or {}
    peak = (targets.get("cpu") or {}).get("peak")
    limit = _cpu_limit_cores(containers)
    if peak is not None and limit is not None:
        cores = parse_cpu_quantity(peak, "targets.cpu.peak")
        if cores > limit:
            # The kernel already caps the pod below the target: it can never bind and the
            # user probably meant something else.
            raise SpecError("UnreachableTarget",
                            f"targets.cpu.peak {peak} ({cores:g} cores) exceeds the pod's CPU "
                            f"limit of {limit:g} cores; the target would never apply")
    gpu = targets.get("gpu") or {}
    if gpu and not any(c.get("resources", {}).get("limits", {}).get(r)
                       for c in containers for r in GPU_RESOURCES):
        raise SpecError("UnreachableTarget", "targets.gpu is set but no container has a GPU "
                                             f"limit ({', '.join(GPU_RESOURCES)})")


# --- children ----------------------------------------------------------------------------

def _labels(tj_name: str) -> dict[str, str]:
    return {LABEL_NAME: tj_name, LABEL_MANAGED_BY: MANAGED_BY}


def build_configmap(tj_name: str, policy_doc: Mapping[str, Any]) -> dict[str, Any]:
    """The policy ConfigMap; mounted as a volume (not subPath) so edits reach the pod."""
    import yaml

    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": configmap_name(tj_name), "labels": _labels(tj_name)},
        "data": {POLICY_KEY: yaml.safe_dump(dict(policy_doc), sort_keys=True)},
    }


def workload_uid(pod: Mapping[str, Any]) -> int | None:
    """The UID the workload runs as, when the template says so for all containers."""
    pod_uid = (pod.get("securityContext") or {}).get("runAsUser")
    uids = {(c.get("securityContext") or {}).get("runAsUser", pod_uid)
            for c in pod.get("containers") or []}
    return uids.pop() if len(uids) == 1 and None not in uids else None


def uses_signals(policy_doc: Mapping[str, Any]) -> bool:
    return str(policy_doc.get("enforcement", "Both")).lower() in ("signals", "both")


def build_sidecar(settings: OperatorSettings, uid: int | None) -> dict[str, Any]:
    """The sidecar as a native sidecar: an init container with restartPolicy Always.

    Kubernetes >= 1.29 starts it before the workload and stops it after the workload's
    containers end, so it never holds the Job open; as a regular container it would keep
    the pod Running forever after the workload exits.

    The Pod Security "restricted" profile allows no added capability except
    NET_BIND_SERVICE, and capabilities added to a non-root container are not effective
    anyway (no ambient set). So signals are sent as the workload's own UID: same UID is
    what kill(2) needs, without CAP_KILL.
    """
    run_as = DEFAULT_SIDECAR_UID if uid is None else uid
    security = {
        "runAsNonRoot": run_as != 0,
        "runAsUser": run_as,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    probe = {"httpGet": {"path": "/healthz", "port": METRICS_PORT_NAME},
             "periodSeconds": 10, "timeoutSeconds": 2, "failureThreshold": 3}
    return {
        "name": SIDECAR_CONTAINER,
        "image": settings.sidecar_image,
        "imagePullPolicy": "IfNotPresent",
        "restartPolicy": "Always",
        "args": ["sidecar", "--policy", f"{POLICY_DIR}/{POLICY_KEY}",
                 "--shared-dir", SHARED_DIR, "--port", str(METRICS_PORT)],
        "ports": [{"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT,
                   "protocol": "TCP"}],
        "resources": {"requests": {"cpu": settings.sidecar_cpu_request,
                                   "memory": settings.sidecar_memory_request},
                      "limits": {"memory": settings.sidecar_memory_limit}},
        "startupProbe": {**probe, "periodSeconds": 1, "failureThreshold": 30},
        "livenessProbe": probe,
        "readinessProbe": {**probe, "httpGet": {"path": "/readyz", "port": METRICS_PORT_NAME},
                           "periodSeconds": 5},
        "securityContext": security,
        "volumeMounts": [{"name": SHARED_VOLUME, "mountPath": SHARED_DIR},
                         {"name": POLICY_VOLUME, "mountPath": POLICY_DIR, "readOnly": True}],
    }


def inject_mode(spec: Mapping[str, Any]) -> str:
    """`spec.throttle.inject` (Auto or None), defaulted as the CRD defaults it."""
    return str((spec.get("throttle") or {}).get("inject") or DEFAULT_INJECT)


def build_inject_container(settings: OperatorSettings) -> dict[str, Any]:
    """The init container that copies the runtime library and its sitecustomize.py into
    the `throttledjob-python` emptyDir (`throttledjob inject-lib DIR`, product image).

    It runs to completion before the workload starts, as a non-root UID with nothing
    but its own volume: the files it writes are world-readable, so any workload UID can
    import them, and it needs no privilege at all (Pod Security "restricted")."""
    return {
        "name": INJECT_CONTAINER,
        "image": settings.sidecar_image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["inject-lib", INJECT_DIR],
        # No .pyc files: the image's root filesystem is read-only here.
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                      "limits": {"memory": "64Mi"}},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": DEFAULT_SIDECAR_UID,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [{"name": INJECT_VOLUME, "mountPath": INJECT_DIR}],
    }


def inject_pythonpath(container: dict[str, Any]) -> None:
    """Put INJECT_DIR first on the container's PYTHONPATH, keeping the user's value.

    - `value` in `env`: prefixed in place.
    - `valueFrom` in `env` (a ConfigMap or Secret key): the entry is renamed
      THROTTLEDJOB_USER_PYTHONPATH, same source, same place, and a PYTHONPATH entry after
      it expands it: `INJECT_DIR:$(THROTTLEDJOB_USER_PYTHONPATH)` (the kubelet expands
      `$(VAR)` from entries defined before).
    - no entry, but `envFrom`: `INJECT_DIR:$(PYTHONPATH)`, which the kubelet expands from
      the envFrom sources (they are resolved before `env`); when none defines it, the
      literal `$(PYTHONPATH)` stays, a directory that does not exist, which Python skips.
    - neither: INJECT_DIR alone. A PYTHONPATH set only in the image (Dockerfile ENV) is
      invisible to Kubernetes and is overridden: repeat it in the template's env.
    """
    env = container.setdefault("env", [])
    for i, e in enumerate(env):
        if e.get("name") != "PYTHONPATH":
            continue
        if "valueFrom" in e:
            env[i] = {**e, "name": ENV_USER_PYTHONPATH}
            env.insert(i + 1, {"name": "PYTHONPATH",
                               "value": f"{INJECT_DIR}:$({ENV_USER_PYTHONPATH})"})
        else:
            user = e.get("value") or ""
            env[i] = {"name": "PYTHONPATH",
                      "value": f"{INJECT_DIR}:{user}" if user else INJECT_DIR}
        return
    value = f"{INJECT_DIR}:$(PYTHONPATH)" if container.get("envFrom") else INJECT_DIR
    env.append({"name": "PYTHONPATH", "value": value})


def build_job(body: Mapping[str, Any], policy_doc: Mapping[str, Any],
              settings: OperatorSettings) -> dict[str, Any]:
    """The Job: the user's jobTemplate, kept as written, plus the sidecar, the shared
    directory, the policy volume, the runtime's environment and the labels that link
    each pod to its ThrottledJob. Ownership (ownerReferences) is added by kopf.adopt."""
    name = body["metadata"]["name"]
    template = copy.deepcopy(dict(body["spec"]["jobTemplate"]))
    meta = template.get("metadata") or {}
    job_spec = template["spec"]
    pod_template = job_spec["template"]
    pod_meta = pod_template.setdefault("metadata", {})
    pod_meta.setdefault("labels", {}).update({**settings.extra_pod_labels, **_labels(name)})
    # The chart's PodMonitor selects on the label; these annotations serve a Prometheus
    # that uses the common annotation-based discovery instead.
    pod_meta.setdefault("annotations", {}).update({
        "prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT),
        "prometheus.io/path": "/metrics"})
    pod = pod_template["spec"]
    pod.setdefault("automountServiceAccountToken", False)
    # The sidecar measures the workload's CPU from /proc and, with Signals, SIGSTOPs and
    # SIGCONTs it: both need the other containers' processes in view.
    pod["shareProcessNamespace"] = True
    for c in pod["containers"]:
        c.setdefault("env", []).append({"name": ENV_DIR, "value": SHARED_DIR})
        c.setdefault("volumeMounts", []).append({"name": SHARED_VOLUME,
                                                 "mountPath": SHARED_DIR})
    # First init container: a native sidecar starts before the later init containers
    # and the workload, so the settings file exists when the workload starts.
    uid = workload_uid(pod)
    ours = [build_sidecar(settings, uid)]
    volumes = [
        {"name": SHARED_VOLUME, "emptyDir": {"sizeLimit": settings.shared_dir_size_limit}},
        {"name": POLICY_VOLUME, "configMap": {"name": configmap_name(name),
                                              "items": [{"key": POLICY_KEY,
                                                         "path": POLICY_KEY}]}},
    ]
    if inject_mode(body["spec"]) == "Auto":
        # After the sidecar (which must start first), before the user's init containers;
        # the workload containers start only once it has completed.
        ours.append(build_inject_container(settings))
        volumes.append({"name": INJECT_VOLUME,
                        "emptyDir": {"sizeLimit": settings.inject_dir_size_limit}})
        for c in pod["containers"]:
            inject_pythonpath(c)
            c["volumeMounts"].append({"name": INJECT_VOLUME, "mountPath": INJECT_DIR,
                                      "readOnly": True})
    pod["initContainers"] = [*ours, *(pod.get("initContainers") or [])]
    pod.setdefault("volumes", []).extend(volumes)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(name),
            "labels": {**(meta.get("labels") or {}), **_labels(name)},
            "annotations": dict(meta.get("annotations") or {}),
        },
        "spec": job_spec,
    }


def signals_uid_warning(body: Mapping[str, Any], policy_doc: Mapping[str, Any]) -> str | None:
    """Why Signals may fail for this template, or None."""
    if not uses_signals(policy_doc) or workload_uid(_pod_spec(body.get("spec") or {})) \
            is not None:
        return None
    return ("enforcement needs signals but the template does not set one runAsUser for "
            f"all containers; the sidecar runs as {DEFAULT_SIDECAR_UID} and can signal only "
            "processes of that UID. Set securityContext.runAsUser in the pod template.")


# --- status ------------------------------------------------------------------------------

def now_iso(now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(conditions: list[dict[str, Any]] | None, type_: str, status: bool,
                  reason: str, message: str, now: str,
                  generation: int | None = None) -> list[dict[str, Any]]:
    """A new list with condition `type_` set; lastTransitionTime moves only on a flip."""
    out = [dict(c) for c in conditions or []]
    value = "True" if status else "False"
    new = {"type": type_, "status": value, "reason": reason, "message": message[:32000],
           "lastTransitionTime": now}
    if generation is not None:
        new["observedGeneration"] = generation
    for i, c in enumerate(out):
        if c.get("type") == type_:
            if c.get("status") == value:
                new["lastTransitionTime"] = c.get("lastTransitionTime", now)
            out[i] = new
            return out
    out.append(new)
    return out


def condition(status: Mapping[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), None)


def status_invalid(status: Mapping[str, Any], error: SpecError, generation: int | None,
                   now: str) -> dict[str, Any]:
    """A refused spec: phase Failed, Ready False, Failed True with the reason."""
    out = dict(status)
    out["phase"] = "Failed"
    out["observedGeneration"] = generation
    conds = set_condition(status.get("conditions"), "Ready", False, error.reason, str(error),
                          now, generation)
    out["conditions"] = set_condition(conds, "Failed", True, error.reason, str(error), now,
                                      generation)
    return out


def status_job_created(status: Mapping[str, Any], job: str, generation: int | None,
                       now: str) -> dict[str, Any]:
    out = dict(status)
    out["jobName"] = job
    out["observedGeneration"] = generation
    if out.get("phase") in (None, "Failed") and not condition(status, "Complete"):
        out["phase"] = "Pending"
    conds = set_condition(status.get("conditions"), "Ready", True, "JobCreated",
                          f"Job {job} created with the throttle sidecar", now, generation)
    failed = condition(status, "Failed")
    if failed and failed.get("reason") not in ("BackoffLimitExceeded", "JobFailed"):
        # A spec error that has been fixed; the Job's own failures are kept.
        conds = set_condition(conds, "Failed", False, "SpecAccepted", "the spec is valid",
                              now, generation)
    out["conditions"] = conds
    return out


def status_from_job(status: Mapping[str, Any], job_status: Mapping[str, Any] | None,
                    now: str) -> dict[str, Any]:
    """Phase, times and Complete/Failed from the Job's status, as the Job controller
    writes it (conditions Complete/Failed, active/ready counters, start/completion)."""
    js = job_status or {}
    out = dict(status)
    job_conds = {c.get("type"): c for c in js.get("conditions") or []
                 if c.get("status") == "True"}
    conds = list(status.get("conditions") or [])
    if "Complete" in job_conds:
        out["phase"] = "Succeeded"
        conds = set_condition(conds, "Complete", True, "JobComplete",
                              job_conds["Complete"].get("message") or "the Job completed", now)
    elif "Failed" in job_conds:
        out["phase"] = "Failed"
        c = job_conds["Failed"]
        conds = set_condition(conds, "Failed", True, c.get("reason") or "JobFailed",
                              c.get("message") or "the Job failed", now)
    elif js.get("active") or js.get("ready"):
        out["phase"] = "Running"
    else:
        out["phase"] = "Pending"
    if out["phase"] != "Running" and condition(status, "Throttling"):
        # Nothing to throttle any more (or yet): the last observed peaks stay.
        conds = set_condition(conds, "Throttling", False, "NotRunning",
                              f"the Job is {out['phase']}", now)
    for key in ("startTime", "completionTime"):
        if js.get(key):
            out[key] = js[key]
    out["conditions"] = conds
    return out


def aggregate_observed(reports: list[Mapping[str, Any]], failures: list[str],
                       now: str) -> dict[str, Any]:
    """`status.observed` from the sidecars' /status documents: the worst pod counts."""

    def top(key: str) -> float | None:
        # A sidecar is another program: skip what is not a finite number (NaN is valid
        # to Python's json module but not to the API server, which would refuse the
        # whole status patch).
        values = []
        for r in reports:
            obs = r.get("observed")
            v = obs.get(key) if isinstance(obs, dict) else None
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                values.append(float(v))
        return max(values) if values else None

    errors = [*failures, *(e for r in reports if isinstance(r.get("errors"), list)
                           for e in r["errors"])]
    return {
        "cpuPeakCores": top("cpuPeakCores"),
        "cpuMaxCores": top("cpuMaxCores"),
        "gpuPeakUtilizationPercent": top("gpuPeakUtilizationPercent"),
        "gpuPeakPowerWatts": top("gpuPeakPowerWatts"),
        "throttleLevel": min(1.0, max(0.0, top("throttleLevel") or 0.0)),
        "slowdown": max(0.0, top("slowdown") or 1.0),
        "pods": len(reports),
        "lastReadTime": now,
        "errors": [str(e)[:500] for e in errors][:16],
    }


def status_with_observed(status: Mapping[str, Any], reports: list[Mapping[str, Any]],
                         failures: list[str], now: str) -> dict[str, Any]:
    """Observed peaks and the Throttling / TargetMet conditions; no reports (no pod
    answered) keeps the last observation and only records why."""
    out = dict(status)
    if not reports:
        if failures:
            observed = dict(status.get("observed") or {})
            observed["errors"] = [f[:500] for f in failures][:16]
            out["observed"] = observed
        return out
    observed = aggregate_observed(reports, failures, now)
    out["observed"] = observed
    level = observed["throttleLevel"]
    conds = set_condition(status.get("conditions"), "Throttling", level > 0,
                          "Throttling" if level > 0 else "UnderTarget",
                          f"throttle level {level:.2f}, slowdown {observed['slowdown']:.2f}",
                          now)
    met = all(bool(r.get("targetMet")) for r in reports)
    exhausted = any(bool(r.get("budgetExhausted")) for r in reports)
    reason = "TargetMet" if met else ("BudgetExhausted" if exhausted else "Converging")
    message = ("the peak is at or under the target" if met else
               "the target is unreachable within maxSlowdown" if exhausted else
               "the peak is over the target; throttling harder")
    out["conditions"] = set_condition(conds, "TargetMet", met, reason, message, now)
    return out


def job_owner_name(job: Mapping[str, Any]) -> str | None:
    """The ThrottledJob that owns this Job, from its controller owner reference."""
    for ref in job.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(
                API_VERSION.split("/")[0] + "/"):
            return ref.get("name")
    return None


def owned_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    return any(ref.get("uid") == owner_uid
               for ref in obj.get("metadata", {}).get("ownerReferences") or [])


def sidecar_endpoint(pod: Mapping[str, Any]) -> tuple[str, int] | None:
    """(pod IP, port of the sidecar's `metrics` port) of a running pod, else None."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip or (pod.get("status") or {}).get("phase") != "Running":
        return None
    spec = pod.get("spec") or {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if c.get("name") == SIDECAR_CONTAINER:
            for p in c.get("ports") or []:
                if p.get("name") == METRICS_PORT_NAME:
                    return ip, int(p["containerPort"])
    return None
