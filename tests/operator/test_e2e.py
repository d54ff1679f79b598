"""End to end: the real operator process against the kmock emulator.

The test plays the parts the emulator lacks: the Job controller (patches a Job's status),
the kubelet (creates a Running pod with an IP) and the sidecar (a real HTTP server on
127.0.0.1 serving /status).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from throttledjob.operator import builders as b
from throttledjob.operator import crd
from throttledjob.sidecar.policy import parse_policy

from ..conftest import wait_for
from .conftest import (
    CM_PATH,
    EVENTS_PATH,
    JOBS_PATH,
    NAMESPACE,
    PODS_PATH,
    TJ_PATH,
    Emulator,
    FakeSidecar,
    OperatorProcess,
    cr_errors,
    k8s_validate,
    make_tj,
)

TIMEOUT = 30.0


def tj_of(emu: Emulator, name: str) -> dict[str, Any]:
    return emu.call("GET", f"{TJ_PATH}/{name}") or {}


def status(emu: Emulator, name: str) -> dict[str, Any]:
    return tj_of(emu, name).get("status") or {}


def cond(emu: Emulator, name: str, type_: str) -> dict[str, Any]:
    return b.condition(status(emu, name), type_) or {}


def jobs_of(emu: Emulator, name: str) -> list[dict[str, Any]]:
    return [j for j in emu.items(JOBS_PATH)
            if j["metadata"].get("labels", {}).get(b.LABEL_NAME) == name]


def events(emu: Emulator, name: str) -> list[tuple[str, str]]:
    return [(e.get("type"), e.get("reason")) for e in emu.items(EVENTS_PATH)
            if e.get("involvedObject", {}).get("name") == name]


def assert_valid_status(emu: Emulator, name: str) -> None:
    errors = cr_errors(tj_of(emu, name))
    assert not errors, errors


def play_pod(emu: Emulator, job: dict[str, Any], sidecar_port: int) -> dict[str, Any]:
    """What the Job controller and kubelet would make: a Running pod from the template,
    its sidecar's metrics port moved to where the fake sidecar listens."""
    template = copy.deepcopy(job["spec"]["template"])
    for c in template["spec"]["initContainers"]:
        if c["name"] == crd.SIDECAR_CONTAINER:
            c["ports"][0]["containerPort"] = sidecar_port
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {**template["metadata"], "name": f"{job['metadata']['name']}-abcde",
                        "namespace": NAMESPACE},
           "spec": template["spec"],
           "status": {"phase": "Running", "podIP": "127.0.0.1"}}
    return emu.call("POST", PODS_PATH, pod, content_type="application/json")


def test_lifecycle_job_status_sidecar_and_delete(
        emulator: Emulator, operator_process: OperatorProcess, sidecar: FakeSidecar) -> None:
    operator_process.start()
    emulator.call("POST", TJ_PATH, make_tj("train"), content_type="application/json")

    jobs = wait_for(lambda: jobs_of(emulator, "train"), TIMEOUT, what="the Job")
    cm = wait_for(lambda: emulator.call("GET", f"{CM_PATH}/train-throttle"), TIMEOUT,
                  what="the ConfigMap")
    wait_for(lambda: status(emulator, "train").get("jobName") == "train", TIMEOUT,
             what="status.jobName")
    tj = tj_of(emulator, "train")
    uid = tj["metadata"]["uid"]
    assert len(jobs) == 1
    job = jobs[0]
    for child in (job, cm):
        assert b.owned_by(child, uid), child["metadata"]
        k8s_validate(child)
    sidecar_c = job["spec"]["template"]["spec"]["initContainers"][0]
    assert sidecar_c["name"] == crd.SIDECAR_CONTAINER and sidecar_c["restartPolicy"] == "Always"
    assert parse_policy(yaml.safe_load(cm["data"]["policy.yaml"])).cpu_peak_cores == 1.5
    st = status(emulator, "train")
    assert st["phase"] == "Pending"
    assert cond(emulator, "train", "Ready")["status"] == "True"
    assert st["observedGeneration"] == tj["metadata"]["generation"]
    assert ("Normal", "JobCreated") in wait_for(lambda: events(emulator, "train"), TIMEOUT,
                                                what="an event")
    assert_valid_status(emulator, "train")

    # The Job controller starts a pod: Running, and the timer reads the sidecar.
    sidecar.doc = {"observed": {"cpuPeakCores": 1.48, "cpuMaxCores": 1.9,
                                "gpuPeakUtilizationPercent": None, "gpuPeakPowerWatts": None,
                                "throttleLevel": 0.4, "slowdown": 1.12},
                   "targetMet": True, "budgetExhausted": False, "levers": ["pacing"],
                   "errors": []}
    play_pod(emulator, job, sidecar.port)
    emulator.call("PATCH", f"{JOBS_PATH}/train/status",
                  {"status": {"active": 1, "startTime": "2026-01-01T00:00:00Z"}})
    wait_for(lambda: status(emulator, "train").get("phase") == "Running", TIMEOUT,
             what="phase Running")
    observed = wait_for(lambda: status(emulator, "train").get("observed"), TIMEOUT,
                        what="status.observed from the sidecar")
    assert observed["cpuPeakCores"] == 1.48 and observed["throttleLevel"] == 0.4
    assert observed["pods"] == 1 and sidecar.hits >= 1
    # Periodic work adds no finalizer (kopf timers would): deletion never waits for us.
    assert not tj_of(emulator, "train")["metadata"].get("finalizers")
    assert cond(emulator, "train", "Throttling")["status"] == "True"
    assert cond(emulator, "train", "TargetMet")["status"] == "True"
    assert status(emulator, "train")["startTime"] == "2026-01-01T00:00:00Z"
    assert_valid_status(emulator, "train")

    # The sidecar reports the budget spent: TargetMet flips, with a Warning event.
    sidecar.doc = {**sidecar.doc, "targetMet": False, "budgetExhausted": True,
                   "observed": {**sidecar.doc["observed"], "throttleLevel": 1.0}}
    wait_for(lambda: cond(emulator, "train", "TargetMet").get("reason") == "BudgetExhausted",
             TIMEOUT, what="TargetMet=False BudgetExhausted")
    wait_for(lambda: ("Warning", "TargetUnreachable") in events(emulator, "train"), TIMEOUT,
             what="a TargetUnreachable event")

    # The Job completes.
    emulator.call("PATCH", f"{JOBS_PATH}/train/status", {"status": {
        "active": 0, "succeeded": 1, "completionTime": "2026-01-01T01:00:00Z",
        "conditions": [{"type": "Complete", "status": "True"}]}})
    wait_for(lambda: status(emulator, "train").get("phase") == "Succeeded", TIMEOUT,
             what="phase Succeeded")
    assert cond(emulator, "train", "Complete")["status"] == "True"
    assert status(emulator, "train")["completionTime"] == "2026-01-01T01:00:00Z"
    assert status(emulator, "train")["observed"]["cpuPeakCores"] == 1.48  # kept
    wait_for(lambda: ("Normal", "JobSucceeded") in events(emulator, "train"), TIMEOUT,
             what="a JobSucceeded event")
    assert_valid_status(emulator, "train")

    # Delete: no finalizer holds the ThrottledJob; its children go with it.
    assert not tj_of(emulator, "train")["metadata"].get("finalizers")
    emulator.call("DELETE", f"{TJ_PATH}/train")
    assert tj_of(emulator, "train") == {}
    assert jobs_of(emulator, "train") == []
    assert emulator.call("GET", f"{CM_PATH}/train-throttle") is None
    # Every Job and ConfigMap the operator sent was valid.
    for body in emulator.sent("CREATE", "/jobs") + emulator.sent("CREATE", "/configmaps"):
        k8s_validate(body)
    assert operator_process.stop() == 0


def test_failed_job_sets_phase_failed(emulator: Emulator,
                                      operator_process: OperatorProcess) -> None:
    operator_process.start()
    emulator.call("POST", TJ_PATH, make_tj("flaky"), content_type="application/json")
    wait_for(lambda: status(emulator, "flaky").get("jobName"), TIMEOUT, what="the Job")
    emulator.call("PATCH", f"{JOBS_PATH}/flaky/status", {"status": {"active": 0, "failed": 1,
                  "conditions": [{"type": "Failed", "status": "True",
                                  "reason": "BackoffLimitExceeded",
                                  "message": "Job has reached the specified backoff limit"}]}})
    wait_for(lambda: status(emulator, "flaky").get("phase") == "Failed", TIMEOUT,
             what="phase Failed")
    failed = cond(emulator, "flaky", "Failed")
    assert failed["status"] == "True" and failed["reason"] == "BackoffLimitExceeded"
    wait_for(lambda: ("Warning", "JobFailed") in events(emulator, "flaky"), TIMEOUT,
             what="a JobFailed event")


def test_throttle_edit_reaches_configmap_and_bad_edit_does_not(
        emulator: Emulator, operator_process: OperatorProcess) -> None:
    operator_process.start()
    emulator.call("POST", TJ_PATH, make_tj("edit", parameters={
        "lr": {"type": "Number", "value": 0.1, "min": 0, "max": 1}}),
        content_type="application/json")
    wait_for(lambda: emulator.call("GET", f"{CM_PATH}/edit-throttle"), TIMEOUT,
             what="the ConfigMap")

    def policy() -> dict[str, Any]:
        cm = emulator.call("GET", f"{CM_PATH}/edit-throttle")
        return yaml.safe_load(cm["data"]["policy.yaml"])

    assert policy()["parameters"] == {"lr": 0.1}
    emulator.call("PATCH", f"{TJ_PATH}/edit", {"spec": {"throttle": {
        "targets": {"cpu": {"peak": "800m"}}, "enforcement": "Both"}}})
    wait_for(lambda: policy()["targets"]["cpu"]["peak"] == "800m", TIMEOUT,
             what="the new peak in the ConfigMap")
    assert policy()["enforcement"] == "Both"
    wait_for(lambda: cond(emulator, "edit", "PolicyApplied").get("status") == "True",
             TIMEOUT, what="PolicyApplied=True")
    emulator.call("PATCH", f"{TJ_PATH}/edit", {"spec": {"parameters": {
        "lr": {"type": "Number", "value": 0.5, "min": 0, "max": 1}}}})
    wait_for(lambda: policy()["parameters"] == {"lr": 0.5}, TIMEOUT,
             what="the new parameter value in the ConfigMap")

    # An edit that passes the schema but not the policy rules: the pod keeps the last
    # good policy and the status says why.
    emulator.call("PATCH", f"{TJ_PATH}/edit", {"spec": {"parameters": {
        "lr": {"type": "Number", "value": 5, "min": 0, "max": 1}}}})
    wait_for(lambda: cond(emulator, "edit", "PolicyApplied").get("status") == "False",
             TIMEOUT, what="PolicyApplied=False")
    assert "above max" in cond(emulator, "edit", "PolicyApplied")["message"]
    assert policy()["parameters"] == {"lr": 0.5}
    assert ("Warning", "InvalidParameter") in events(emulator, "edit")

    # A template change cannot reach the running Job: a condition says so.
    emulator.call("PATCH", f"{TJ_PATH}/edit", {"spec": {"jobTemplate": {"spec": {
        "backoffLimit": 3}}}})
    wait_for(lambda: cond(emulator, "edit", "TemplateApplied").get("reason")
             == "JobTemplateImmutable", TIMEOUT, what="TemplateApplied=False")
    assert len(jobs_of(emulator, "edit")) == 1
    assert jobs_of(emulator, "edit")[0]["spec"]["backoffLimit"] == 0
    assert_valid_status(emulator, "edit")


@pytest.mark.parametrize(("tj", "reason"), [
    (make_tj("too-much", throttle={"targets": {"cpu": {"peak": "4"}}}), "UnreachableTarget"),
    (make_tj("gpu-less", throttle={"targets": {"gpu": {"peakPowerWatts": 200}}}),
     "UnreachableTarget"),
    (make_tj("vol-clash", volumes=[{"name": "throttledjob-shared", "emptyDir": {}}]),
     "VolumeClash"),
    (make_tj("bad-param", parameters={"n": {"type": "Integer", "value": "ten"}}),
     "InvalidParameter"),
])
def test_bad_spec_creates_no_job(emulator: Emulator, operator_process: OperatorProcess,
                                 tj: dict[str, Any], reason: str) -> None:
    assert cr_errors(tj) == []  # the schema lets it through: the operator must refuse it
    operator_process.start()
    name = tj["metadata"]["name"]
    emulator.call("POST", TJ_PATH, tj, content_type="application/json")
    wait_for(lambda: status(emulator, name).get("phase") == "Failed", TIMEOUT,
             what="phase Failed")
    failed = cond(emulator, name, "Failed")
    assert failed["status"] == "True" and failed["reason"] == reason
    assert cond(emulator, name, "Ready")["status"] == "False"
    wait_for(lambda: ("Warning", reason) in events(emulator, name), TIMEOUT,
             what=f"a {reason} event")
    assert jobs_of(emulator, name) == []
    assert emulator.sent("CREATE", "/jobs") == []
    assert emulator.sent("CREATE", "/configmaps") == []
    assert_valid_status(emulator, name)


def test_fixing_a_refused_spec_creates_the_job(emulator: Emulator,
                                               operator_process: OperatorProcess) -> None:
    operator_process.start()
    emulator.call("POST", TJ_PATH, make_tj("fixme", throttle={"targets": {"cpu": {
        "peak": "8"}}}), content_type="application/json")
    wait_for(lambda: status(emulator, "fixme").get("phase") == "Failed", TIMEOUT,
             what="phase Failed")
    emulator.call("PATCH", f"{TJ_PATH}/fixme", {"spec": {"throttle": {"targets": {"cpu": {
        "peak": "1"}}}}})
    wait_for(lambda: jobs_of(emulator, "fixme"), TIMEOUT, what="the Job after the fix")
    # The status is written just after the Job is created: poll, do not race it.
    wait_for(lambda: status(emulator, "fixme").get("jobName") == "fixme", TIMEOUT,
             what="status.jobName after the fix")
    st = status(emulator, "fixme")
    assert st["phase"] == "Pending"
    assert cond(emulator, "fixme", "Failed")["status"] == "False"
    assert len(jobs_of(emulator, "fixme")) == 1


def test_restart_never_duplicates_the_job(emulator: Emulator,
                                          operator_process: OperatorProcess) -> None:
    # Created while the operator is down, with the ConfigMap already there (stale): as if
    # the operator had been killed between creating the ConfigMap and the Job.
    created = emulator.call("POST", TJ_PATH, make_tj("restart"),
                            content_type="application/json")
    stale = b.build_configmap("restart", {"targets": {"cpu": {"peak": "3"}}})
    stale["metadata"].update(namespace=NAMESPACE, ownerReferences=[{
        "apiVersion": crd.API_VERSION, "kind": crd.KIND, "name": "restart",
        "uid": created["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}])
    emulator.call("POST", CM_PATH, stale, content_type="application/json")

    operator_process.start()
    wait_for(lambda: status(emulator, "restart").get("jobName"), TIMEOUT, what="the Job")
    cm = emulator.call("GET", f"{CM_PATH}/restart-throttle")
    assert yaml.safe_load(cm["data"]["policy.yaml"])["targets"]["cpu"]["peak"] == "1500m"

    # Killed hard, then restarted twice: resume handlers run each time.
    for _ in range(2):
        operator_process.kill()
        operator_process.start()
        marker = f"{operator_process.starts}00m"
        emulator.call("PATCH", f"{TJ_PATH}/restart", {"spec": {"throttle": {"targets": {
            "cpu": {"peak": marker}}}}})
        wait_for(lambda m=marker: yaml.safe_load(emulator.call(
            "GET", f"{CM_PATH}/restart-throttle")["data"]["policy.yaml"])["targets"]["cpu"][
            "peak"] == m, TIMEOUT, what="the restarted operator to handle an edit")
    assert len(jobs_of(emulator, "restart")) == 1
    assert len(emulator.items(CM_PATH)) == 1
    assert status(emulator, "restart")["phase"] == "Pending"
    assert_valid_status(emulator, "restart")


def test_inject_auto_job_has_init_container_volume_and_users_pythonpath(
        emulator: Emulator, operator_process: OperatorProcess) -> None:
    operator_process.start()
    tj = make_tj("zero-code", throttle={"targets": {"cpu": {"peak": "1500m"}},
                                        "inject": "Auto"})
    tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "PYTHONPATH", "value": "/app/src"}]
    emulator.call("POST", TJ_PATH, tj, content_type="application/json")
    (job,) = wait_for(lambda: jobs_of(emulator, "zero-code"), TIMEOUT, what="the Job")
    k8s_validate(job)
    pod = job["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == [crd.SIDECAR_CONTAINER,
                                                          crd.INJECT_CONTAINER]
    assert pod["initContainers"][1]["args"] == ["inject-lib", b.INJECT_DIR]
    assert {"name": crd.INJECT_VOLUME, "emptyDir": {"sizeLimit": "32Mi"}} in pod["volumes"]
    (trainer,) = pod["containers"]
    assert {"name": "PYTHONPATH", "value": f"{b.INJECT_DIR}:/app/src"} in trainer["env"]
    assert {"name": crd.INJECT_VOLUME, "mountPath": b.INJECT_DIR, "readOnly": True} \
        in trainer["volumeMounts"]
    cm = emulator.call("GET", f"{CM_PATH}/zero-code-throttle")
    assert "inject" not in yaml.safe_load(cm["data"]["policy.yaml"])

    # Turning it off later cannot reach the created Job: a condition says so.
    wait_for(lambda: status(emulator, "zero-code").get("jobName"), TIMEOUT,
             what="status.jobName")
    emulator.call("PATCH", f"{TJ_PATH}/zero-code", {"spec": {"throttle": {"inject": "None"}}})
    wait_for(lambda: cond(emulator, "zero-code", "TemplateApplied").get("reason")
             == "InjectImmutable", TIMEOUT, what="TemplateApplied=False InjectImmutable")
    assert len(jobs_of(emulator, "zero-code")) == 1
    assert ("Warning", "InjectImmutable") in events(emulator, "zero-code")
    assert_valid_status(emulator, "zero-code")
