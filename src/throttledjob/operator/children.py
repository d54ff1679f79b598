"""The objects a ThrottledJob owns: its Job (the user's template plus the sidecar, the
volumes and, with `inject: Auto`, the library's init container) and its policy ConfigMap;
and how the operator recognises them again (labels, owner references, the sidecar's port).

Pure functions, dicts in and dicts out: the handlers adopt the result and send it.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from throttledjob.contracts.names import (
    ENV_CONTAINER,
    ENV_DIR,
    GPU_RESOURCE,
    NODE_CSI_DRIVER,
    NODE_POWER_CAP_ATTRIBUTE,
    NODE_SOCKET_DIR,
)
from throttledjob.contracts.policy import parse_policy

from . import child, cpu_limits, job_split, quota
from .api_names import (
    API_VERSION,
    DEFAULT_SIDECAR_UID,
    GUARD_CONTAINER,
    KIND,
    NODE_AGENT_VOLUME,
    POLICY_VOLUME,
    SHARED_VOLUME,
    SIDECAR_CONTAINER,
)
from .config import OperatorSettings
from .inject import add_runtime_library, inject_mode
from .kueue import QUEUE_LABEL, carried_labels

SHARED_DIR = "/var/run/throttledjob"
POLICY_DIR = "/etc/throttledjob"
POLICY_KEY = "policy.yaml"
# Zero-code injection (spec.throttle.inject: Auto): where the runtime library lands.
METRICS_PORT = 9400
METRICS_PORT_NAME = "metrics"
LABEL_NAME = "throttledjob.io/name"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
# On the Job: template_hash() of the spec it was built from.
TEMPLATE_HASH = "throttledjob.io/template-hash"
MANAGED_BY = "throttledjob-operator"


def job_name(tj_name: str) -> str:
    """The Job is named after its ThrottledJob, so `kubectl get job NAME` finds it."""
    return tj_name


def configmap_name(tj_name: str) -> str:
    return f"{tj_name}-throttle"


def _labels(tj_name: str) -> dict[str, str]:
    return {LABEL_NAME: tj_name, LABEL_MANAGED_BY: MANAGED_BY}


def build_configmap(tj_name: str, spec: Mapping[str, Any],
                    policy_doc: Mapping[str, Any]) -> dict[str, Any]:
    """The policy ConfigMap: the pods' policy (quota.pod_policy); mounted as a volume (not
    subPath) so edits reach the pod."""
    import yaml

    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": configmap_name(tj_name), "labels": _labels(tj_name)},
        "data": {POLICY_KEY: yaml.safe_dump(quota.pod_policy(spec, policy_doc),
                                            sort_keys=True)},
    }


def workload_uid(pod: Mapping[str, Any]) -> int | None:
    """The UID the workload runs as, when the template says so for all containers."""
    pod_uid = (pod.get("securityContext") or {}).get("runAsUser")
    uids = {(c.get("securityContext") or {}).get("runAsUser", pod_uid)
            for c in pod.get("containers") or []}
    return uids.pop() if len(uids) == 1 and None not in uids else None




def _as_workload(uid: int | None) -> dict[str, Any]:
    """The security context of the containers that signal the workload: its UID, no
    capability, nothing writable but their volumes (Pod Security "restricted")."""
    run_as = DEFAULT_SIDECAR_UID if uid is None else uid
    return {
        "runAsNonRoot": run_as != 0,
        "runAsUser": run_as,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


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
    security = _as_workload(uid)
    probe = {"httpGet": {"path": "/healthz", "port": METRICS_PORT_NAME},
             "periodSeconds": 10, "timeoutSeconds": 2, "failureThreshold": 3}
    return {
        "name": SIDECAR_CONTAINER,
        "image": settings.sidecar_image,
        "imagePullPolicy": "IfNotPresent",
        "restartPolicy": "Always",
        "args": ["sidecar", "--policy", f"{POLICY_DIR}/{POLICY_KEY}",
                 "--shared-dir", SHARED_DIR, "--metrics-port", str(METRICS_PORT)],
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


def build_guard(settings: OperatorSettings, uid: int | None) -> dict[str, Any]:
    """The guard (`throttledjob guard`): a native sidecar of its own that resumes the
    workload when a stop the sidecar announced (its stop lease) ends and the workload is
    still stopped, i.e. the sidecar died inside it. A container apart, so an OOM kill or
    a crash loop of the sidecar does not take it along; same UID as the workload, no
    capability, the shared directory read-only: it can send SIGCONT and nothing else
    (docs/reliability.md)."""
    return {
        "name": GUARD_CONTAINER,
        "image": settings.sidecar_image,
        "imagePullPolicy": "IfNotPresent",
        "restartPolicy": "Always",
        # Named tj-guard from its first instruction: the sidecar never counts it as the
        # workload, not even while it starts (contracts.names.GUARD_PROCESS_NAME).
        "command": ["tj-guard"],
        "args": ["--shared-dir", SHARED_DIR],
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
        "resources": {"requests": {"cpu": "5m", "memory": "16Mi"},
                      "limits": {"memory": "32Mi"}},
        "securityContext": _as_workload(uid),
        "volumeMounts": [{"name": SHARED_VOLUME, "mountPath": SHARED_DIR, "readOnly": True}],
    }


def stand_down_hook(container: dict[str, Any]) -> None:
    """A preStop hook on a workload container that ends throttling before the kubelet
    sends it SIGTERM (GET /prestop on the sidecar's port), so a workload that saves a
    checkpoint on SIGTERM does it unthrottled, never stopped or paced. A container with
    its own preStop hook keeps it (there can be one): then the workload is held until
    the sidecar itself is stopped, after the workload's containers."""
    lifecycle = container.setdefault("lifecycle", {})
    lifecycle.setdefault("preStop", {"httpGet": {"path": "/prestop", "port": METRICS_PORT}})


def inject_pod(pod_template: dict[str, Any], body: Mapping[str, Any],
               policy_doc: Mapping[str, Any], settings: OperatorSettings) -> None:
    """Make one pod template of the child a throttled one, in place: the sidecar (and the
    guard, and with `inject: Auto` the library's init container), the shared directory,
    the policy volume, the runtime's environment, the labels that link each pod to its
    ThrottledJob and, with enforcement Quota, the CPU limits of the target (scope Job:
    the pod's even share of it)."""
    name = body["metadata"]["name"]
    _label_pod(pod_template.setdefault("metadata", {}), name, settings)
    pod = pod_template["spec"]
    pod.setdefault("automountServiceAccountToken", False)
    # The sidecar measures the workload's CPU from /proc and, with Signals, SIGSTOPs and
    # SIGCONTs it: both need the other containers' processes in view.
    pod["shareProcessNamespace"] = True
    for c in pod["containers"]:
        # Its name tells the sidecar which container a process is in (cpuDemandCores).
        c.setdefault("env", []).extend([{"name": ENV_DIR, "value": SHARED_DIR},
                                        {"name": ENV_CONTAINER, "value": c["name"]}])
        c.setdefault("volumeMounts", []).append({"name": SHARED_VOLUME,
                                                 "mountPath": SHARED_DIR})
        stand_down_hook(c)
    # First init container: a native sidecar starts before the later init containers
    # and the workload, so the settings file exists when the workload starts.
    uid = workload_uid(pod)
    sidecar = build_sidecar(settings, uid)
    # Enforcement Quota: the kernel holds the target with the workload's CPU limits, unless
    # a request is over its share (quota.py decides; signals hold it then).
    target = job_split.pod_target(body["spec"], quota.kernel_target(body["spec"], policy_doc))
    if target is not None:
        cpu_limits.apply(pod["containers"], target)
    # The guard after the sidecar: it starts once the sidecar's startup probe passed,
    # still before any workload container.
    ours = [sidecar, build_guard(settings, uid)]
    volumes = [
        {"name": SHARED_VOLUME, "emptyDir": {"sizeLimit": settings.shared_dir_size_limit}},
        {"name": POLICY_VOLUME, "configMap": {"name": configmap_name(name),
                                              "items": [{"key": POLICY_KEY,
                                                         "path": POLICY_KEY}]}},
    ]
    if inject_mode(body["spec"]) == "Auto":
        add_runtime_library(pod, ours, volumes, settings)
    if settings.node_agent and requests_gpus(pod):
        volumes.append(node_agent_volume(sidecar, allows_power_cap(policy_doc)))
    pod["initContainers"] = [*ours, *(pod.get("initContainers") or [])]
    pod.setdefault("volumes", []).extend(volumes)


def _label_pod(pod_meta: dict[str, Any], name: str, settings: OperatorSettings) -> None:
    """The labels that link a pod to its ThrottledJob, and the scrape annotations."""
    pod_meta.setdefault("labels", {}).update({**settings.extra_pod_labels, **_labels(name)})
    # The chart's PodMonitor selects on the label; these annotations serve a Prometheus
    # that uses the common annotation-based discovery instead.
    if settings.scrape_annotations:
        pod_meta.setdefault("annotations", {}).update({
            "prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT),
            "prometheus.io/path": "/metrics"})


def requests_gpus(pod: Mapping[str, Any]) -> bool:
    return any((c.get("resources") or {}).get("limits", {}).get(GPU_RESOURCE)
               for c in [*pod["containers"], *(pod.get("initContainers") or [])])


def node_agent_volume(sidecar: dict[str, Any], power_cap: bool) -> dict[str, Any]:
    """The GPU node agent's CSI volume, mounted in the sidecar alone: its socket answers
    for this pod's GPUs (node/csi.py), and caps them only with `power_cap` (the agent's
    own check of levers.gpuPowerLimit, as the pod was made). A CSI volume is allowed under
    "restricted". Read-only, in the volume and the mount (the agent refuses a publish that
    is not): the directory is the agent's, and a socket is connected to, not written."""
    sidecar["volumeMounts"].append({"name": NODE_AGENT_VOLUME, "mountPath": NODE_SOCKET_DIR,
                                    "readOnly": True})
    return {"name": NODE_AGENT_VOLUME, "csi": {
        "driver": NODE_CSI_DRIVER, "readOnly": True,
        "volumeAttributes": {NODE_POWER_CAP_ATTRIBUTE: str(power_cap).lower()}}}


def allows_power_cap(policy_doc: Mapping[str, Any]) -> bool:
    return parse_policy(policy_doc).allows_gpu_power_limit


def build_child(body: Mapping[str, Any], policy_doc: Mapping[str, Any],
                settings: OperatorSettings) -> dict[str, Any]:
    """The Job or the JobSet (child.py): the user's template, kept as written, with every
    pod template made a throttled one (inject_pod), the ThrottledJob's name and Kueue's
    queue and priority labels (kueue.py). Ownership (ownerReferences) is added by
    kopf.adopt."""
    name = body["metadata"]["name"]
    ours = copy.deepcopy(dict(body["spec"]))
    template = child.template(ours)
    meta = template.get("metadata") or {}
    spec = template["spec"]
    jobset = child.is_jobset(ours)
    for job_spec in child.job_specs(ours):  # the copy's own dicts: injected in place
        inject_pod(job_spec["template"], body, policy_doc, settings)
    labels = {**(meta.get("labels") or {}),
              **carried_labels(body["metadata"].get("labels")), **_labels(name)}
    if body["spec"].get("suspend") or labels.get(QUEUE_LABEL):
        # Kueue's own webhook suspends a queued Job at creation, and un-suspends it on
        # admission; set here too, a Job made before Kueue's webhook runs never starts.
        spec["suspend"] = True
    return {
        "apiVersion": child.JOBSET_API if jobset else "batch/v1",
        "kind": child.kind(body["spec"]),
        "metadata": {
            "name": job_name(name),
            "labels": labels,
            "annotations": {**(meta.get("annotations") or {}),
                            TEMPLATE_HASH: template_hash(body["spec"])},
        },
        "spec": spec,
    }


def template_hash(spec: Mapping[str, Any]) -> str:
    """What of a ThrottledJob's spec shapes its pods, which a made Job cannot change: the
    Job's or JobSet's template and throttle.inject."""
    shape = {"template": child.template(dict(spec)), "inject": inject_mode(spec)}
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


def owner_reference(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference of the ThrottledJob that owns this Job or ConfigMap."""
    for ref in obj.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(
                API_VERSION.split("/")[0] + "/"):
            return ref
    return None


def job_owner_name(job: Mapping[str, Any]) -> str | None:
    """The name of the ThrottledJob that owns this Job."""
    return (owner_reference(job) or {}).get("name")


def left_by_predecessor(obj: Mapping[str, Any], name: str, uid: str) -> bool:
    """Whether `obj` is owned by an earlier ThrottledJob of this name (deleted and made
    anew): the garbage collector is still to remove it."""
    ref = owner_reference(obj) or {}
    return ref.get("name") == name and ref.get("uid") not in (None, uid)


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
