"""The pure functions: what the operator would send (children.py), validated against the
official Kubernetes schemas (1.30 and the newest bundled), what it refuses
(validation.py), and the status logic (status.py)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from testing.builders import built, owned, pod_of, restricted_violations
from testing.manifests import NAMESPACE, make_tj
from testing.validation import k8s_validate
from throttledjob.contracts.names import (
    ENV_CONTAINER,
    ENV_DIR,
    GUARD_PROCESS_NAME,
)
from throttledjob.contracts.policy import parse_policy
from throttledjob.contracts.status import parse_status
from throttledjob.operator import api_names
from throttledjob.operator.children import (
    DEFAULT_SIDECAR_UID,
    LABEL_NAME,
    METRICS_PORT,
    SHARED_DIR,
    build_child,
    job_owner_name,
    sidecar_endpoint,
)
from throttledjob.operator.conditions import (
    as_stored,
    at_generation,
    condition,
    set_condition,
    status_from_job,
    status_invalid,
    status_job_created,
    status_job_gone,
)
from throttledjob.operator.config import OperatorSettings
from throttledjob.operator.observed import status_with_observed
from throttledjob.operator.validation import (
    SpecError,
    quota_warning,
    signals_uid_warning,
    validate,
)

NOW = "2026-01-01T00:00:00Z"


def test_job_and_configmap_are_valid_kubernetes_objects() -> None:
    job, cm = built(make_tj())
    k8s_validate(job)
    k8s_validate(cm)
    assert job["metadata"]["namespace"] == cm["metadata"]["namespace"] == NAMESPACE
    for obj in (job, cm):
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref["kind"] == api_names.KIND and ref["controller"] is True
        assert ref["uid"] == owned(make_tj())["metadata"]["uid"]


def test_job_keeps_the_users_template_and_adds_the_sidecar() -> None:
    tj = make_tj(initContainers=[{"name": "fetch", "image": "busybox"}],
                 volumes=[{"name": "data", "emptyDir": {}}], nodeSelector={"gpu": "a100"})
    tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0].update(
        env=[{"name": "EPOCHS", "value": "3"}],
        volumeMounts=[{"name": "data", "mountPath": "/data"}])
    job, _ = built(tj)
    pod = pod_of(job)
    assert job["metadata"]["name"] == "train"
    assert job["metadata"]["labels"]["team"] == "vision"  # the user's Job labels
    assert job["spec"]["backoffLimit"] == 0
    assert pod["nodeSelector"] == {"gpu": "a100"}
    assert [c["name"] for c in pod["initContainers"]] == [api_names.SIDECAR_CONTAINER,
                                                          api_names.GUARD_CONTAINER, "fetch"]
    (trainer,) = pod["containers"]
    assert trainer["env"] == [{"name": "EPOCHS", "value": "3"},
                              {"name": ENV_DIR, "value": SHARED_DIR},
                              {"name": ENV_CONTAINER, "value": trainer["name"]}]
    assert trainer["volumeMounts"] == [{"name": "data", "mountPath": "/data"},
                                       {"name": api_names.SHARED_VOLUME, "mountPath": SHARED_DIR}]
    assert [v["name"] for v in pod["volumes"]] == ["data", api_names.SHARED_VOLUME,
                                                    api_names.POLICY_VOLUME]
    policy_volume = pod["volumes"][-1]["configMap"]
    assert policy_volume["name"] == "train-throttle"
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels[LABEL_NAME] == "train"
    assert job["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "9400"
    # Where a PodMonitor scrapes the sidecars, no annotation asks for a second scrape.
    quiet, _ = built(tj, OperatorSettings(scrape_annotations=False))
    assert not any(k.startswith("prometheus.io/")
                   for k in quiet["spec"]["template"]["metadata"].get("annotations", {}))
    # The input is not mutated (kopf hands the same body to later handlers).
    user_pod = tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert user_pod["initContainers"] == [{"name": "fetch", "image": "busybox"}]
    assert "env" not in user_pod["containers"][0] or len(user_pod["containers"][0]["env"]) == 1


def test_sidecar_follows_the_contract() -> None:
    job, _ = built(make_tj())
    sidecar = pod_of(job)["initContainers"][0]
    assert sidecar["image"] == "ghcr.io/throttledjob/throttledjob:0.1.0"
    assert sidecar["args"] == ["sidecar", "--policy", "/etc/throttledjob/policy.yaml",
                               "--shared-dir", "/var/run/throttledjob", "--metrics-port", "9400"]
    assert sidecar["restartPolicy"] == "Always"  # native sidecar: never blocks completion
    assert sidecar["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"
    mounts = {m["mountPath"]: m for m in sidecar["volumeMounts"]}
    assert "subPath" not in mounts["/etc/throttledjob"]  # subPath would freeze the policy
    assert mounts["/etc/throttledjob"]["readOnly"] is True
    assert "/var/run/throttledjob" in mounts
    sc = sidecar["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}


def test_the_guard_runs_apart_as_the_workload_and_can_only_read_the_lease() -> None:
    job, _ = built(make_tj(throttle={"targets": {"cpu": {"peak": 1}},
                                     "enforcement": "Signals"}))
    pod = pod_of(job)
    sidecar, guard = pod["initContainers"][:2]
    assert guard["name"] == api_names.GUARD_CONTAINER and guard["restartPolicy"] == "Always"
    assert guard["command"] == [GUARD_PROCESS_NAME]  # its process name from the start
    assert guard["args"] == ["--shared-dir", SHARED_DIR]
    # Same UID as the sidecar (the workload's: kill(2) needs it), nothing more.
    assert guard["securityContext"] == sidecar["securityContext"]
    assert guard["securityContext"]["runAsUser"] == 1000
    assert guard["volumeMounts"] == [{"name": api_names.SHARED_VOLUME, "mountPath": SHARED_DIR,
                                      "readOnly": True}]
    # A container of its own memory: the sidecar's OOM kill does not take it along.
    assert guard["resources"]["limits"]["memory"] == "32Mi"
    assert restricted_violations(pod) == []
    k8s_validate(job)


def test_each_workload_container_ends_throttling_before_its_sigterm() -> None:
    tj = make_tj()
    containers = tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    own = {"exec": {"command": ["/bin/save"]}}
    containers.append({"name": "saver", "image": "busybox",
                       "lifecycle": {"preStop": own, "postStart": own}})
    job, _ = built(tj)
    trainer, saver = pod_of(job)["containers"]
    assert trainer["lifecycle"] == {"preStop": {"httpGet": {"path": "/prestop",
                                                            "port": METRICS_PORT}}}
    assert saver["lifecycle"] == {"preStop": own, "postStart": own}  # the user's kept
    k8s_validate(job)


def test_pod_meets_restricted_and_gets_no_token_by_default() -> None:
    job, _ = built(make_tj(throttle={"targets": {"cpu": {"peak": 1}},
                                     "enforcement": "Signals"}))
    pod = pod_of(job)
    assert restricted_violations(pod) == []
    assert pod["automountServiceAccountToken"] is False
    assert pod["shareProcessNamespace"] is True
    # Signals need the same UID as the workload, not a capability.
    assert pod["initContainers"][0]["securityContext"]["runAsUser"] == 1000


@pytest.mark.parametrize("node_agent, gpus, power_cap, mounted", [
    (True, 1, "Allow", True), (True, 1, "Deny", True), (True, 0, "Allow", False),
    (False, 1, "Allow", False)])
def test_the_sidecar_of_a_gpu_pod_gets_the_node_agents_volume_where_it_runs(
        node_agent: bool, gpus: int, power_cap: str, mounted: bool) -> None:
    """With the chart's node agent on, a pod that requests a GPU: the agent's CSI volume
    in the sidecar alone (its socket answers for this pod's GPUs), still "restricted";
    the volume tells the agent whether the ThrottledJob allows the power cap. Read-only,
    the volume and its mount: the agent refuses a publish that is not."""
    tj = make_tj(throttle={"targets": {"cpu": {"peak": 1}}, "enforcement": "Signals",
                           "levers": {"gpuPowerLimit": power_cap}})
    _container_set(tj, resources={"limits": {"nvidia.com/gpu": gpus}} if gpus else {})
    doc = validate(owned(tj))
    pod = pod_of(build_child(owned(tj), doc, OperatorSettings(node_agent=node_agent)))
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert (volumes.get(api_names.NODE_AGENT_VOLUME) == {
        "name": api_names.NODE_AGENT_VOLUME, "csi": {
            "driver": "node.throttledjob.io", "readOnly": True,
            "volumeAttributes": {"powerCap": "true" if power_cap == "Allow" else "false"}},
    }) is mounted
    mounts = {c["name"]: [m["mountPath"] for m in c.get("volumeMounts", [])
                          if m["name"] != api_names.NODE_AGENT_VOLUME or m.get("readOnly")]
              for c in [*pod["initContainers"], *pod["containers"]]}
    assert [c for c, paths in mounts.items() if "/run/throttledjob/node" in paths] == (
        [api_names.SIDECAR_CONTAINER] if mounted else [])
    assert restricted_violations(pod) == []


def test_users_token_choice_is_kept() -> None:
    job, _ = built(make_tj(automountServiceAccountToken=True))
    assert pod_of(job)["automountServiceAccountToken"] is True


def test_the_checker_sees_an_unrestricted_template() -> None:
    """The restricted check above could fail: a user container that may escalate fails it."""
    tj = make_tj()
    tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0][
        "securityContext"] = {"allowPrivilegeEscalation": True}
    job, _ = built(tj)
    assert "trainer: allowPrivilegeEscalation" in restricted_violations(pod_of(job))


def test_unknown_workload_uid_with_signals_warns_and_runs_sidecar_non_root() -> None:
    tj = make_tj(throttle={"targets": {"cpu": {"peak": 1}}, "enforcement": "Both"},
                 securityContext={"runAsNonRoot": True})
    doc = validate(owned(tj))
    assert "runAsUser" in (signals_uid_warning(tj, doc) or "")
    job, _ = built(tj)
    sc = pod_of(job)["initContainers"][0]["securityContext"]
    assert sc["runAsUser"] == DEFAULT_SIDECAR_UID and sc["runAsNonRoot"] is True
    assert signals_uid_warning(make_tj(), validate(owned(make_tj()))) is None


def test_root_workload_gets_a_root_sidecar_without_capabilities() -> None:
    job, _ = built(make_tj(securityContext={"runAsUser": 0}))
    sc = pod_of(job)["initContainers"][0]["securityContext"]
    assert sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    k8s_validate(job)


def test_configmap_holds_the_policy_and_parameter_values() -> None:
    tj = make_tj(parameters={"lr": {"type": "Number", "value": 0.01, "min": 0, "max": 1},
                             "workers": {"type": "Integer", "value": 4},
                             "amp": {"type": "Boolean", "value": True},
                             "precision": {"type": "String", "value": "bf16",
                                           "choices": ["fp32", "bf16"]}})
    _, cm = built(tj)
    doc = yaml.safe_load(cm["data"]["policy.yaml"])
    assert doc["parameters"] == {"lr": 0.01, "workers": 4, "amp": True, "precision": "bf16"}
    policy = parse_policy(doc)
    assert policy.cpu_peak_cores == 1.5 and policy.params["workers"] == 4
    assert cm["metadata"]["name"] == "train-throttle"


def test_settings_from_environment() -> None:
    s = OperatorSettings.from_env({"THROTTLEDJOB_SIDECAR_IMAGE": "registry.local/tj:dev",
                                     "THROTTLEDJOB_STATUS_INTERVAL": "2.5"})
    assert s.sidecar_image == "registry.local/tj:dev" and s.status_interval_seconds == 2.5
    job = build_child(owned(make_tj()), {}, s)
    assert pod_of(job)["initContainers"][0]["image"] == "registry.local/tj:dev"


def _pod_set(tj: dict[str, Any], **changes: Any) -> dict[str, Any]:
    tj["spec"]["jobTemplate"]["spec"]["template"]["spec"].update(changes)
    return tj


def _container_set(tj: dict[str, Any], **changes: Any) -> dict[str, Any]:
    tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0].update(changes)
    return tj


# Specs the CRD schema lets through but the operator must refuse (no Job).
def queued(tj: dict[str, Any], queue: str, template: str | None = None,
           priority: str | None = None) -> dict[str, Any]:
    """`tj` with Kueue's queue label (and a priority class), on the ThrottledJob and, where
    `template` is given, another on its jobTemplate."""
    tj = copy.deepcopy(tj)
    tj["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": queue,
                                **({"kueue.x-k8s.io/priority-class": priority} if priority
                                   else {})}
    if template:
        tj["spec"]["jobTemplate"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = template
    return tj


REFUSED = [
    (make_tj(throttle={"targets": {"cpu": {"peak": "3"}}}), "UnreachableTarget",
     "exceeds the pod's CPU limit"),
    (make_tj(throttle={"targets": {"gpu": {"peakUtilizationPercent": 50}}}),
     "UnreachableTarget", "no container has a GPU limit"),
    (_container_set(make_tj(), volumeMounts=[{"name": "x", "mountPath": "/etc/throttledjob"}]),
     "MountPathClash", "/etc/throttledjob"),
    (_container_set(make_tj(), volumeMounts=[{"name": "x",
                                              "mountPath": "/var/run/throttledjob/"}]),
     "MountPathClash", "/var/run/throttledjob"),
    (_pod_set(make_tj(), volumes=[{"name": "throttledjob-policy", "emptyDir": {}}]),
     "VolumeClash", "throttledjob-policy"),
    # The GPU node agent's volume says whether the pod may cap its GPU: the operator's.
    (_pod_set(make_tj(), volumes=[{"name": "mine", "csi": {
        "driver": "node.throttledjob.io", "volumeAttributes": {"powerCap": "true"}}}]),
     "VolumeClash", "GPU node agent's driver"),
    (_container_set(make_tj(), env=[{"name": ENV_DIR, "value": "/tmp"}]), "EnvClash",
     ENV_DIR),
    (_container_set(make_tj(), env=[{"name": ENV_CONTAINER, "value": "other"}]),
     "EnvClash", ENV_CONTAINER),
    (_container_set(make_tj(), ports=[{"containerPort": 9400}]), "PortClash", "9400"),
    (_pod_set(make_tj(), shareProcessNamespace=False), "ProcessNamespaceRequired",
     "shareProcessNamespace"),
    (_pod_set(make_tj(), initContainers=[{"name": "throttledjob-sidecar"}]), "NameClash",
     "reserved"),
    (make_tj(parameters={"n": {"type": "Integer", "value": 2.5}}), "InvalidParameter",
     "not a finite Integer"),
    (make_tj(parameters={"n": {"type": "Integer", "value": True}}), "InvalidParameter",
     "not a finite Integer"),
    (make_tj(parameters={"n": {"type": "Number", "value": 5, "max": 1}}), "InvalidParameter",
     "above max"),
    (make_tj(parameters={"p": {"type": "String", "value": "fp8", "choices": ["fp32"]}}),
     "InvalidParameter", "not one of"),
    (make_tj(throttle={"targets": {"cpu": {"peak": "1"}}, "mode": "Sideways"}),
     "InvalidPolicy", "mode must be one of"),
    (make_tj(throttle={"targets": {"cpu": {"peak": "1"}}, "parameters": {"a": 1}}),
     "InvalidPolicy", "spec.parameters"),
    (_pod_set(make_tj(), hostPID=True), "HostAccessRefused", "hostPID"),
    (_pod_set(make_tj(), hostIPC=True), "HostAccessRefused", "hostIPC"),
    (_pod_set(make_tj(), hostNetwork=True), "HostAccessRefused", "hostNetwork"),
    (_container_set(make_tj(), securityContext={"privileged": True}), "HostAccessRefused",
     "privileged"),
    (queued(make_tj(), "team-a", template="team-b"), "LabelClash",
     "kueue.x-k8s.io/queue-name=team-a of the ThrottledJob and kueue.x-k8s.io/queue-name=team-b"),
]


@pytest.mark.parametrize(("tj", "reason", "message"), REFUSED,
                         ids=[r for _, r, _ in REFUSED])
def test_refused_specs(tj: dict[str, Any], reason: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        validate(owned(tj))
    assert info.value.reason == reason
    assert message in str(info.value)


def test_kueues_labels_are_carried_and_a_queued_job_starts_suspended() -> None:
    """Kueue queues the Job by its queue label and un-suspends it on admission: made
    suspended, it never starts before (whether or not Kueue's webhook ran)."""
    job, _ = built(queued(make_tj(), "team-a", priority="high"))
    labels = job["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "team-a"
    assert labels["kueue.x-k8s.io/priority-class"] == "high"
    assert labels["team"] == "vision"  # the template's own kept
    assert job["spec"]["suspend"] is True
    k8s_validate(job)  # raises on an invalid object
    plain, _ = built(make_tj())
    assert "suspend" not in plain["spec"]
    assert not any(k.startswith("kueue.x-k8s.io/") for k in plain["metadata"]["labels"])
    tj = make_tj()
    tj["spec"]["suspend"] = True
    asked, _ = built(tj)
    assert asked["spec"]["suspend"] is True


def test_host_access_is_accepted_when_the_operator_allows_it() -> None:
    tj = _pod_set(make_tj(), hostPID=True)
    assert validate(owned(tj), allow_host_access=True)
    assert OperatorSettings.from_env({"THROTTLEDJOB_ALLOW_HOST_ACCESS": "true"}
                                       ).allow_host_access
    assert not OperatorSettings.from_env({}).allow_host_access


def test_cpu_target_within_the_limit_and_gpu_target_with_a_gpu_are_accepted() -> None:
    tj = make_tj(throttle={"targets": {"cpu": {"peak": "2"},
                                       "gpu": {"peakPowerWatts": 250}}})
    _container_set(tj, resources={"limits": {"cpu": "2", "nvidia.com/gpu": 1}})
    assert validate(owned(tj))["targets"]["gpu"] == {"peakPowerWatts": 250}
    # No CPU limit: nothing to compare with, the target is the only cap.
    assert validate(owned(_container_set(make_tj(throttle={"targets": {"cpu": {
        "peak": "64"}}}), resources={})))


# --- status ------------------------------------------------------------------------------

def test_conditions_keep_transition_time_unless_status_flips() -> None:
    conds = set_condition([], "Ready", True, "A", "a", "t1")
    conds = set_condition(conds, "Ready", True, "B", "b", "t2")
    assert conds == [{"type": "Ready", "status": "True", "reason": "B", "message": "b",
                      "lastTransitionTime": "t1"}]
    conds = set_condition(conds, "Ready", False, "C", "c", "t3")
    assert conds[0]["lastTransitionTime"] == "t3" and len(conds) == 1


@pytest.mark.parametrize(("job_status", "phase"), [
    (None, "Pending"),
    ({}, "Pending"),
    ({"active": 1}, "Running"),
    ({"ready": 1, "active": 1}, "Running"),
    ({"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}, "Succeeded"),
    ({"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]},
     "Failed"),
    ({"conditions": [{"type": "Failed", "status": "False"}], "active": 1}, "Running"),
])
def test_phase_from_job_status(job_status: dict[str, Any] | None, phase: str) -> None:
    assert status_from_job({}, {"status": job_status}, {}, NOW)["phase"] == phase


def test_failed_job_reason_reaches_the_condition() -> None:
    st = status_from_job({}, {"status": {"conditions": [{"type": "Failed", "status": "True",
                                                          "reason": "DeadlineExceeded",
                                                          "message": "too slow"}]}}, {}, NOW)
    assert condition(st, "Failed") == {"type": "Failed", "status": "True",
                                         "reason": "DeadlineExceeded", "message": "too slow",
                                         "lastTransitionTime": NOW}


def suspended_job(queue: str | None = None, suspend: bool = True) -> dict[str, Any]:
    labels = {"kueue.x-k8s.io/queue-name": queue} if queue else {}
    return {"metadata": {"labels": labels}, "spec": {"suspend": suspend},
            "status": {"conditions": [{"type": "Suspended", "status": str(suspend)}]}}


@pytest.mark.parametrize(("queue", "asked", "phase", "reason"), [
    (None, True, "Suspended", "SuspendRequested"),
    (None, False, "Suspended", "JobSuspended"),       # the Job's own suspend, set by hand
    ("team", False, "Queued", "Queued"),              # Kueue holds it
    ("team", True, "Suspended", "SuspendRequested"),  # both: ours is what to say
])
def test_a_suspended_job_is_queued_only_where_kueue_holds_it(queue, asked, phase, reason):
    st = status_from_job({}, suspended_job(queue), {"metadata": {"generation": 3},
                                                    "spec": {"suspend": asked}}, NOW)
    assert st["phase"] == phase
    assert condition(st, "Suspended")["status"] == "True"
    assert condition(st, "Suspended")["reason"] == reason
    assert condition(st, "Suspended")["observedGeneration"] == 3
    assert condition(st, "Admitted") is None  # not admitted: Kueue's reason comes later


def test_a_job_kueue_lets_run_is_admitted_and_resumed() -> None:
    queued = status_from_job({}, suspended_job("team"), {}, NOW)
    running = status_from_job(queued, {**suspended_job("team", suspend=False),
                                        "status": {"active": 1}}, {}, NOW)
    assert running["phase"] == "Running"
    assert condition(running, "Suspended")["reason"] == "Resumed"
    assert condition(running, "Admitted")["status"] == "True"
    plain = status_from_job({}, {"status": {"active": 1}}, {}, NOW)
    assert condition(plain, "Admitted") is None and condition(plain, "Suspended") is None


def workload(active: bool = True, **conditions: tuple[str, str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "job-train-1a2b3"}, "spec": {"active": active},
            "status": {"conditions": [{"type": t, "status": s, "reason": r, "message": m}
                                      for t, (s, r, m) in conditions.items()]}}


@pytest.mark.parametrize(("wl", "admitted", "reason"), [
    (None, "False", "Pending"),  # Kueue has not made it yet
    (workload(QuotaReserved=("False", "Pending", "insufficient unused quota for cpu")),
     "False", "Pending"),
    (workload(QuotaReserved=("False", "Inadmissible", "LocalQueue nope doesn't exist")),
     "False", "Inadmissible"),
    (workload(False, Evicted=("True", "Deactivated", "")), "False", "Deactivated"),
    (workload(QuotaReserved=("True", "QuotaReserved", ""), Admitted=("True", "Admitted", "ok")),
     "True", "Admitted"),
])
def test_the_admitted_condition_says_what_kueue_says(wl, admitted, reason) -> None:
    from throttledjob.operator.conditions import status_with_admission

    c = condition(status_with_admission({}, wl, {"metadata": {"generation": 2}}, NOW),
                  "Admitted")
    assert (c["status"], c["reason"], c["observedGeneration"]) == (admitted, reason, 2)
    if wl and reason == "Inadmissible":
        assert c["message"] == "LocalQueue nope doesn't exist"


def test_the_workload_is_held_to_the_throttledjobs_suspend() -> None:
    from throttledjob.operator.kueue import active_patch

    assert active_patch(workload(True), suspend=True) == {"spec": {"active": False}}
    assert active_patch(workload(False), suspend=False) == {"spec": {"active": True}}
    assert active_patch(workload(True), suspend=False) is None
    assert active_patch({"spec": {}}, suspend=False) is None  # active by default


def report(cpu: float, level: float, met: bool | None = True, exhausted: bool = False,
           errors: list[str] | None = None) -> dict[str, Any]:
    return {"observed": {"cpuPeakCores": cpu, "cpuMaxCores": cpu + 0.5,
                         "gpuPeakUtilizationPercent": None, "gpuPeakPowerWatts": None,
                         "throttleLevel": level, "slowdown": 1 + level / 4},
            "targetMet": met, "budgetExhausted": exhausted, "levers": [],
            "errors": errors or []}


def test_observed_is_the_worst_pod_and_target_met_needs_all() -> None:
    st = status_with_observed({}, [report(1.2, 0.2), report(1.6, 0.5, met=False)], [], NOW)
    obs = st["observed"]
    assert obs["cpuPeakCores"] == 1.6 and obs["throttleLevel"] == 0.5
    assert obs["gpuPeakUtilizationPercent"] is None and obs["pods"] == 2
    assert condition(st, "TargetMet")["status"] == "False"
    assert condition(st, "TargetMet")["reason"] == "Converging"
    assert condition(st, "Throttling")["status"] == "True"


def test_target_met_is_unknown_while_a_pod_has_a_target_with_no_sample() -> None:
    st = status_with_observed({}, [report(1.2, 0.2), report(1.0, 0.0, met=None)], [], NOW)
    assert condition(st, "TargetMet")["status"] == "Unknown"
    assert condition(st, "TargetMet")["reason"] == "NotMeasured"
    # A pod that misses its target outweighs one not yet measured.
    st = status_with_observed(st, [report(1.6, 0.5, met=False), report(1.0, 0.0, met=None)],
                              [], NOW)
    assert condition(st, "TargetMet")["status"] == "False"


def test_observed_tells_what_held_the_peak_and_the_work_reported() -> None:
    one = {**report(1.0, 0.3), "levers": ["pacing", "quota"]}
    one["observed"]["steps"] = 700
    two = {**report(1.1, 0.4), "levers": ["threads", "quota", "a-lever-of-a-newer-sidecar"]}
    two["observed"]["steps"] = 800
    obs = status_with_observed({}, [one, two, report(0.9, 0.0)], [], NOW)["observed"]
    # Every pod's levers, in the sidecar's order; one it does not know is left out (the
    # CRD's enum would refuse the whole status patch). Steps add up across the pods.
    assert obs["levers"] == ["quota", "pacing", "threads"]
    assert obs["steps"] == 1500


def test_budget_exhausted_and_unthrottled() -> None:
    st = status_with_observed({}, [report(2.0, 1.0, met=False, exhausted=True)], [], NOW)
    assert condition(st, "TargetMet")["reason"] == "BudgetExhausted"
    # The sidecar's words for why go into the message, as its /status gave them.
    why = {**report(2.0, 1.0, met=False, exhausted=True),
           "budgetReason": "maxSlowdown needs the containers' CPU limit at 1.60 cores"}
    st = status_with_observed({}, [report(1.0, 0.0), parse_status({**why, "version": 1})],
                              [], NOW)
    assert condition(st, "TargetMet")["message"] == (
        "the target is unreachable within maxSlowdown: maxSlowdown needs the containers' "
        "CPU limit at 1.60 cores")
    st = status_with_observed({}, [report(0.5, 0.0)], [], NOW)
    assert condition(st, "Throttling")["status"] == "False"
    assert condition(st, "TargetMet")["status"] == "True"


def test_unreachable_sidecars_keep_the_last_observation() -> None:
    first = status_with_observed({}, [report(1.2, 0.2)], [], NOW)
    later = status_with_observed(first, [], ["pod p: connection refused"], "later")
    assert later["observed"]["cpuPeakCores"] == 1.2
    assert later["observed"]["errors"] == ["pod p: connection refused"]
    assert status_with_observed(first, [], [], "later") == first


def test_a_read_within_five_percent_is_not_written_until_its_time_is_a_minute_old() -> None:
    """The status poller writes a running ThrottledJob's status only when a figure moved
    by more than 5% (measured figures move a little every interval), when anything else
    changed, or to refresh lastReadTime once a minute (Kube.update_status skips a no-op)."""
    # As the API server stores it after a merge patch: the null figures (no GPU) gone.
    first = as_stored(status_with_observed({}, [report(1.2, 0.2)], [], NOW))
    assert "gpuPeakUtilizationPercent" not in first["observed"]
    later = "2026-01-01T00:00:30Z"
    for same in ([report(1.2, 0.2)], [report(1.25, 0.205)]):  # 4% and 2.5% moves
        assert as_stored(status_with_observed(first, same, [], later)) == first, same
    for moved in ([report(1.3, 0.2)], [report(1.2, 0.25)], [report(1.2, 0.2, met=False)],
                  [report(1.2, 0.2), report(1.2, 0.2)], [report(1.2, 0.2, errors=["e"])]):
        st = status_with_observed(first, moved, [], later)
        assert as_stored(st) != first, moved
    assert status_with_observed(first, [report(1.3, 0.2)], [], later)["observed"][
        "lastReadTime"] == later
    stale = status_with_observed(first, [report(1.2, 0.2)], [], "2026-01-01T00:01:00Z")
    assert stale["observed"]["lastReadTime"] == "2026-01-01T00:01:00Z"
    # A figure near zero moves by at least 0.01 before it counts: 0.004 -> 0.012 does not.
    idle = as_stored(status_with_observed({}, [report(0.004, 0.0)], [], NOW))
    assert as_stored(status_with_observed(idle, [report(0.012, 0.0)], [], later)) == idle


def test_hostile_report_values_are_clamped() -> None:
    nan = report(float("nan"), float("inf"))
    st = status_with_observed({}, [report(1.0, 7.0), {"observed": "nope", "errors": 3},
                                     nan], [], NOW)
    assert st["observed"]["throttleLevel"] == 1.0
    assert st["observed"]["cpuPeakCores"] == 1.0
    json.dumps(st, allow_nan=False)  # what the API server accepts


def test_invalid_then_created_clears_the_spec_failure() -> None:
    st = status_invalid({}, "VolumeClash", "bad", 1, NOW)
    assert st["phase"] == "Failed" and condition(st, "Failed")["status"] == "True"
    st = status_job_created(st, "train", 2, NOW)
    assert st["phase"] == "Pending" and st["observedGeneration"] == 2
    assert condition(st, "Failed")["status"] == "False"
    assert condition(st, "Ready")["status"] == "True"


def test_a_jobs_own_failure_is_not_cleared_as_a_fixed_spec() -> None:
    """Only a refusal's Failed is the spec's to clear: a Job that failed by its deadline
    stays failed, its lastTransitionTime as it was."""
    st = status_from_job({}, {"status": {"conditions": [{"type": "Failed", "status": "True",
                                                          "reason": "DeadlineExceeded"}]}},
                         {}, "2026-01-01T00:00:00Z")
    st = status_job_created(st, "train", 1, NOW)
    assert (condition(st, "Failed")["status"], condition(st, "Failed")["reason"],
            condition(st, "Failed")["lastTransitionTime"]) == (
        "True", "DeadlineExceeded", "2026-01-01T00:00:00Z")


@pytest.mark.parametrize(("phase", "gone"), [("Running", True), ("Suspended", True),
                                             ("Succeeded", False), ("Failed", False)])
@pytest.mark.parametrize(("deleted", "reason"), [(True, "JobDeleted"), (False, "JobGone")])
def test_a_job_gone_before_it_finished_fails_its_throttledjob(
        phase: str, gone: bool, deleted: bool, reason: str) -> None:
    st = status_job_created({}, "train", 1, NOW)
    st = {**status_from_job(st, {"status": {"active": 1}}, {}, NOW), "phase": phase}
    after = status_job_gone(st, "train", NOW, deleted)
    if not gone:   # its TTL, after it finished: nothing changes
        assert after == st
        return
    assert after["phase"] == "Failed"
    for type_ in ("Failed", "Ready"):
        c = condition(after, type_)
        assert (c["status"], c["reason"]) == ("True" if type_ == "Failed" else "False",
                                              reason)
        assert "re-create the ThrottledJob" in c["message"]
    # Another Job's name (one made anew for a ThrottledJob of the same name): not ours.
    assert status_job_gone(st, "train-old", NOW, deleted) == st
    # Taken for gone by a read that missed it, then seen to complete: Succeeded, and no
    # Failed condition says otherwise.
    done = status_from_job(after, {"status": {"conditions": [
        {"type": "Complete", "status": "True"}]}}, {}, NOW)
    assert done["phase"] == "Succeeded"
    assert (condition(done, "Failed")["status"], condition(done, "Ready")["status"]) == (
        "False", "True")


def test_sidecar_endpoint_from_the_pod() -> None:
    job, _ = built(make_tj())
    pod = {"metadata": {"name": "p"}, "spec": pod_of(job),
           "status": {"phase": "Running", "podIP": "10.0.0.7"}}
    assert sidecar_endpoint(pod) == ("10.0.0.7", 9400)
    assert sidecar_endpoint({**pod, "status": {"phase": "Pending"}}) is None
    assert job_owner_name(job) == "train"


# --- enforcement Quota: the workload's CPU limits from the target ---------------------------

def quota_tj(peak: Any = "1500m", **containers: dict[str, Any]) -> dict[str, Any]:
    """A ThrottledJob under enforcement Quota; keyword arguments are containers by name
    (their `resources`), in order."""
    tj = make_tj(throttle={"targets": {"cpu": {"peak": peak}}, "enforcement": "Quota"})
    pod = tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    template = pod["containers"][0]
    pod["containers"] = [{**copy.deepcopy(template), "name": name, "resources": resources}
                         for name, resources in containers.items()]
    return tj


def sidecar_env(job: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod_of(job)["initContainers"][0].get("env", [])}


def test_quota_sets_each_containers_limit_from_its_share_of_the_target() -> None:
    job, _ = built(quota_tj("1500m", a={"requests": {"cpu": "1"}},
                            b={"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}}))
    k8s_validate(job)
    a, b = pod_of(job)["containers"]
    # In proportion to the requests, which stay as written (a Burstable pod).
    assert a["resources"] == {"requests": {"cpu": "1"}, "limits": {"cpu": "1000m"}}
    assert b["resources"] == {"requests": {"cpu": "500m"},
                              "limits": {"memory": "1Gi", "cpu": "500m"}}
    for c in (a, b):
        assert c["resizePolicy"] == [{"resourceName": "cpu", "restartPolicy": "NotRequired"}]


def test_quota_splits_evenly_without_requests_and_keeps_a_lower_own_limit() -> None:
    job, _ = built(quota_tj(1, a={}, b={"limits": {"cpu": "200m"}}, c={}))
    limits = [c["resources"]["limits"]["cpu"] for c in pod_of(job)["containers"]]
    # 333m each, rounded down so the sum never passes the target; b's own 200m stays.
    assert limits == ["333m", "200m", "333m"]


def test_a_request_over_its_share_falls_back_to_signals_and_says_why() -> None:
    tj = quota_tj(1, a={"requests": {"cpu": "2"}}, b={})
    doc = validate(owned(tj))
    job, cm = built(tj)
    assert all("cpu" not in (c["resources"].get("limits") or {})
               for c in pod_of(job)["containers"])
    # Decided here, once: the pods' policy says what holds the target.
    assert yaml.safe_load(cm["data"]["policy.yaml"])["enforcement"] == "Both"
    _, held = built(quota_tj(1, a={"requests": {"cpu": "500m"}}, b={}))
    assert yaml.safe_load(held["data"]["policy.yaml"])["enforcement"] == "Quota"
    warning = quota_warning(tj, doc) or ""
    assert "container a requests 2 CPU, more than its 500m share" in warning
    assert quota_warning(quota_tj(1, a={"requests": {"cpu": "500m"}}, b={}), doc) is None


def test_other_enforcements_leave_the_limits_alone() -> None:
    for enforcement in ("Both", "Signals", "Cooperative"):
        tj = quota_tj(1, a={})
        tj["spec"]["throttle"]["enforcement"] = enforcement
        job, _ = built(tj)
        assert pod_of(job)["containers"][0]["resources"] == {}, enforcement
        no_target = quota_tj(1, a={})  # mode Fixed: Adaptive needs a target (spec_rules.py)
    no_target["spec"]["throttle"].update(targets={}, mode="Fixed")
    job, _ = built(no_target)
    assert pod_of(job)["containers"][0]["resources"] == {}


def test_a_new_target_resizes_a_running_pods_limits_in_place() -> None:
    from throttledjob.operator.cpu_limits import resize

    tj = quota_tj("1500m", a={"requests": {"cpu": "200m"}}, b={"requests": {"cpu": "100m"}})
    job, _ = built(tj)
    pod = copy.deepcopy(pod_of(job))
    template = tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    # The same target: nothing to do.
    assert resize(pod, 1.5, template) is None
    # A lower and a higher one: every workload container to its share, by name, CPU only.
    assert resize(pod, 0.75, template) == {"spec": {"containers": [
        {"name": "a", "resources": {"limits": {"cpu": "500m"}}},
        {"name": "b", "resources": {"limits": {"cpu": "250m"}}}]}}
    assert resize(pod, 3, template)["spec"]["containers"][0]["resources"]["limits"][
        "cpu"] == "2000m"
    # A target whose share is under a request the user wrote cannot be a limit.
    assert resize(pod, 0.2, template) is None


def test_a_request_the_api_server_defaulted_follows_its_limit_down_and_up_only_if_it_must(
        ) -> None:
    """No request written: the API server set it to the limit. A shrink lowers it (it may
    not pass the limit); a grow leaves it in a Burstable pod (a request raised needs room
    on the node and passes what Kueue admitted, where a limit does not) and raises it in
    a Guaranteed one (whose QoS class a resize may not change)."""
    from throttledjob.operator.cpu_limits import resize

    tj = quota_tj(1, a={})
    job, _ = built(tj)
    pod = copy.deepcopy(pod_of(job))
    pod["containers"][0]["resources"]["requests"] = {"cpu": "1000m"}  # defaulted
    template = tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert resize(pod, 0.5, template)["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "500m"}, "requests": {"cpu": "500m"}}
    pod["containers"][0]["resources"] = {"limits": {"cpu": "500m"}, "requests": {"cpu": "500m"}}
    assert resize(pod, 1.5, template)["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "1500m"}}
    assert resize(pod, 1.5, template, guaranteed=True)["spec"]["containers"][0][
        "resources"] == {"limits": {"cpu": "1500m"}, "requests": {"cpu": "1500m"}}


def test_measured_use_splits_the_target_none_under_its_request_or_a_tenth_of_even() -> None:
    from throttledjob.operator.cpu_limits import resize, split

    tj = quota_tj(1, a={}, b={"requests": {"cpu": "100m"}}, c={})
    job, _ = built(tj)
    pod = copy.deepcopy(pod_of(job))
    template = tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert [c["resources"]["limits"]["cpu"] for c in pod["containers"]] == [
        "333m", "333m", "333m"]  # before any measurement: even (not every one requests)
    # a held back at its limit and 2 cores wide, b using 20m, c idle: a gets the rest of
    # b's request (its floor) and c's tenth of an even share.
    demand = {"a": 2.0, "b": 0.02, "c": 0.0}
    patch = resize(pod, 1, template, demand, tolerance=0.1)
    assert [(c["name"], c["resources"]["limits"]["cpu"]) for c in
            patch["spec"]["containers"]] == [("a", "866m"), ("b", "100m"), ("c", "33m")]
    for c, new in zip(pod["containers"], patch["spec"]["containers"], strict=True):
        c["resources"]["limits"] = new["resources"]["limits"]
    # Use moving a little is not worth a resize; a container waking up is.
    assert resize(pod, 1, template, {"a": 1.9, "b": 0.03, "c": 0.01}, tolerance=0.1) is None
    woke = resize(pod, 1, template, {"a": 1.0, "b": 0.02, "c": 1.0}, tolerance=0.1)
    assert [c["resources"]["limits"]["cpu"] for c in woke["spec"]["containers"]] == [
        "450m", "100m", "450m"]
    # A container not named (no process left to measure) wants nothing.
    assert [c["resources"]["limits"]["cpu"] for c in resize(
        pod, 1, template, {"a": 1.0, "b": 1.0}, tolerance=0.1)["spec"]["containers"]] == [
        "483m", "483m", "33m"]
    # Nothing measured: by request where all have one, else even.
    assert [c["resources"]["limits"]["cpu"] for c in resize(pod, 1, template, {})["spec"][
        "containers"]] == ["333m", "333m", "333m"]
    # The floors alone fill the total: scaled down to it, never over.
    assert sum(split([1.0, 0.0], [0.8, 0.4], 1.0)) == pytest.approx(1.0)


def test_a_request_the_api_server_defaulted_from_our_limit_follows_it() -> None:
    from throttledjob.operator.cpu_limits import resize

    tj = quota_tj("1500m", a={"limits": {"cpu": "2"}})
    job, _ = built(tj)
    pod = copy.deepcopy(pod_of(job))
    # What the API server stores: no request written, so it is defaulted to the limit.
    pod["containers"][0]["resources"]["requests"] = {"cpu": "1500m"}
    template = tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert resize(pod, 0.9, template) == {"spec": {"containers": [
        {"name": "a", "resources": {"limits": {"cpu": "900m"}, "requests": {"cpu": "900m"}}}]}}


def test_a_pending_resize_turns_quota_resized_false_until_it_is_applied() -> None:
    from throttledjob.operator.pod_conditions import pending_resizes, status_with_resizes

    pod = {"metadata": {"name": "p-1"}, "status": {"conditions": [
        {"type": "PodResizePending", "status": "True", "reason": "Infeasible",
         "message": "Node didn't have enough capacity: cpu, requested: 64000, capacity: 2000"},
        {"type": "Ready", "status": "True"}]}}
    pending = pending_resizes([pod, {"metadata": {"name": "p-2"}, "status": {}}])
    assert pending == ["p-1: Infeasible: Node didn't have enough capacity: cpu, requested: "
                       "64000, capacity: 2000"]
    # No resize ever pending: no condition at all.
    assert "conditions" not in status_with_resizes({}, [], NOW)
    held = status_with_resizes({}, pending, NOW)
    (c,) = held["conditions"]
    assert (c["type"], c["status"], c["reason"]) == ("QuotaResized", "False", "ResizePending")
    assert "Infeasible" in c["message"]
    (c,) = status_with_resizes(held, [], NOW)["conditions"]
    assert (c["status"], c["reason"]) == ("True", "QuotaResized")


def test_a_container_that_cannot_start_turns_pods_started_false_with_the_kubelets_reason(
        ) -> None:
    """An image the node does not have (pullPolicy Never) or cannot pull: the
    ThrottledJob says so, naming the pod, container and image, instead of a pod stuck in
    Pending with no word from the product; the sidecar's own image counts too."""
    from throttledjob.operator.pod_conditions import status_with_stuck, stuck_containers

    waiting = {"reason": "ErrImageNeverPull",
               "message": 'Container image "localhost/throttledjob:dev" is not present '
                          "with pull policy of Never"}
    pod = {"metadata": {"name": "p-1"}, "status": {
        "initContainerStatuses": [{"name": "throttledjob-sidecar", "image": "tj:0.1.0",
                                   "state": {"waiting": {"reason": "ImagePullBackOff"}}}],
        "containerStatuses": [
            {"name": "work", "image": "localhost/throttledjob:dev",
             "state": {"waiting": waiting}},
            {"name": "other", "image": "x", "state": {"waiting": {
                "reason": "PodInitializing"}}}]}}
    stuck = stuck_containers([pod, {"metadata": {"name": "p-2"}, "status": {}}])
    assert [reason for reason, _ in stuck] == ["ImagePullBackOff", "ErrImageNeverPull"]
    assert stuck[1][1] == ('p-1/work: image localhost/throttledjob:dev: Container image '
                           '"localhost/throttledjob:dev" is not present with pull policy '
                           "of Never")
    assert "conditions" not in status_with_stuck({}, [], NOW)  # never stuck: no condition
    held = status_with_stuck({}, stuck, NOW)
    (c,) = held["conditions"]
    assert (c["type"], c["status"], c["reason"]) == ("PodsStarted", "False",
                                                     "ImagePullBackOff")
    assert "p-1/throttledjob-sidecar" in c["message"] and "p-1/work" in c["message"]
    (c,) = status_with_stuck(held, [], NOW)["conditions"]
    assert (c["status"], c["reason"]) == ("True", "Started")


def kubectl_wait_met(tj: dict[str, Any], type_: str) -> bool:
    """`kubectl wait --for=condition=TYPE`'s rule: the condition True, and current: its
    own observedGeneration where it has one, else status.observedGeneration, at least
    metadata.generation (kubectl's condition.go)."""
    status = tj.get("status") or {}
    cond = condition(status, type_) or {}
    seen = cond.get("observedGeneration", status.get("observedGeneration", 0))
    return cond.get("status") == "True" and seen >= tj["metadata"]["generation"]


def test_kubectl_wait_for_ready_works_after_a_live_edit() -> None:
    """A throttle edit (generation 2) acted on: Ready, stamped at generation 1 when the
    Job was made, is stamped 2 as well; before, `kubectl wait --for=condition=Ready`
    read it as stale and waited for good. Not before the edit is acted on."""
    tj = {"metadata": {"generation": 1},
          "status": status_job_created({}, "train", 1, "2026-11-28T10:00:00Z")}
    assert kubectl_wait_met(tj, "Ready")
    tj["metadata"]["generation"] = 2
    assert not kubectl_wait_met(tj, "Ready")
    tj["status"] = at_generation(tj["status"], 2)
    assert kubectl_wait_met(tj, "Ready") and tj["status"]["observedGeneration"] == 2
