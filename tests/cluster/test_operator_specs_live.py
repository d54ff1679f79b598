"""What the operator makes of a spec, on a real API server: edits that reach the running
pod and edits that cannot, specs the schema lets through that the operator refuses, a
failed Job, a restart over a stale ConfigMap, and zero-code injection."""

from __future__ import annotations

from typing import Any

import pytest

from testing.cluster_cli import (
    TIMEOUT,
    Kubectl,
    jobs_of,
    policy_of,
    tj_condition,
    tj_events,
    tj_status,
)
from testing.helpers import wait_for
from testing.manifests import tj_manifest
from testing.operator_process import OperatorProcess
from throttledjob.operator import api_names
from throttledjob.operator.children import build_configmap
from throttledjob.operator.inject import INJECT_DIR


def patch(kubectl: Kubectl, namespace: str, name: str, spec: dict[str, Any]) -> None:
    import json

    kubectl("patch", "tj", "-n", namespace, name, "--type=merge",
            "-p", json.dumps({"spec": spec}))


def test_failed_job_sets_phase_failed(kubectl: Kubectl, real_operator: OperatorProcess,
                                      namespace: str) -> None:
    real_operator.start()
    tj = tj_manifest("flaky", namespace)
    tj["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["annotations"][
        "throttledjob.io/test-exit-code"] = "3"
    kubectl.apply(tj)
    wait_for(lambda: tj_status(kubectl, namespace, "flaky").get("phase") == "Failed", TIMEOUT,
             what="phase Failed")
    failed = tj_condition(kubectl, namespace, "flaky", "Failed")
    assert failed["status"] == "True" and failed["reason"] == "BackoffLimitExceeded"
    wait_for(lambda: ("Warning", "JobFailed") in tj_events(kubectl, namespace, "flaky"),
             TIMEOUT, what="a JobFailed event")


def test_throttle_edit_reaches_configmap_and_bad_edit_does_not(
        kubectl: Kubectl, real_operator: OperatorProcess, namespace: str) -> None:
    real_operator.start()
    kubectl.apply(tj_manifest("edit", namespace, run_for="1h", parameters={
        "lr": {"type": "Number", "value": 0.1, "min": 0, "max": 1}}))
    wait_for(lambda: policy_of(kubectl, namespace, "edit"), TIMEOUT, what="the ConfigMap")
    assert policy_of(kubectl, namespace, "edit")["parameters"] == {"lr": 0.1}

    patch(kubectl, namespace, "edit", {"throttle": {"targets": {"cpu": {"peak": "800m"}},
                                                    "enforcement": "Both"}})
    wait_for(lambda: policy_of(kubectl, namespace, "edit")["targets"]["cpu"]["peak"] == "800m",
             TIMEOUT, what="the new peak in the ConfigMap")
    assert policy_of(kubectl, namespace, "edit")["enforcement"] == "Both"
    wait_for(lambda: tj_condition(kubectl, namespace, "edit", "PolicyApplied").get("status")
             == "True", TIMEOUT, what="PolicyApplied=True")

    # An edit that passes the schema but not the policy rules: the pod keeps the last
    # good policy and the status says why.
    patch(kubectl, namespace, "edit", {"parameters": {
        "lr": {"type": "Number", "value": 5, "min": 0, "max": 1}}})
    wait_for(lambda: tj_condition(kubectl, namespace, "edit", "PolicyApplied").get("status")
             == "False", TIMEOUT, what="PolicyApplied=False")
    assert "above max" in tj_condition(kubectl, namespace, "edit", "PolicyApplied")["message"]
    assert policy_of(kubectl, namespace, "edit")["parameters"] == {"lr": 0.1}
    assert ("Warning", "InvalidParameter") in tj_events(kubectl, namespace, "edit")

    # A template change cannot reach the running Job: a condition says so.
    patch(kubectl, namespace, "edit", {"jobTemplate": {"spec": {"backoffLimit": 3}}})
    wait_for(lambda: tj_condition(kubectl, namespace, "edit", "TemplateApplied").get("reason")
             == "JobTemplateImmutable", TIMEOUT, what="TemplateApplied=False")
    (job,) = jobs_of(kubectl, namespace, "edit")
    assert job["spec"]["backoffLimit"] == 0
    # Reverted: the template is the Job's again, and the condition says so.
    patch(kubectl, namespace, "edit", {"jobTemplate": {"spec": {"backoffLimit": 0}}})
    wait_for(lambda: tj_condition(kubectl, namespace, "edit", "TemplateApplied").get("reason")
             == "TemplateMatchesJob", TIMEOUT, what="TemplateApplied=True again")
    assert tj_condition(kubectl, namespace, "edit", "TemplateApplied")["status"] == "True"


BAD_FOR_THE_OPERATOR = [
    ("too-much", {"throttle": {"targets": {"cpu": {"peak": "4"}}}}, "UnreachableTarget"),
    ("gpu-less", {"throttle": {"targets": {"gpu": {"peakPowerWatts": 200}}}},
     "UnreachableTarget"),
    ("vol-clash", {"volumes": [{"name": "throttledjob-shared", "emptyDir": {}}]},
     "VolumeClash"),
    ("bad-param", {"parameters": {"n": {"type": "Integer", "value": "ten"}}},
     "InvalidParameter"),
]


@pytest.mark.parametrize(("name", "change", "reason"), BAD_FOR_THE_OPERATOR,
                         ids=[n for n, _, _ in BAD_FOR_THE_OPERATOR])
def test_a_spec_the_schema_admits_but_the_operator_refuses_creates_nothing(
        kubectl: Kubectl, real_operator: OperatorProcess, namespace: str, name: str,
        change: dict[str, Any], reason: str) -> None:
    real_operator.start()
    tj = tj_manifest(name, namespace)
    if "throttle" in change:
        tj["spec"]["throttle"] = {**tj["spec"]["throttle"], **change["throttle"]}
    if "parameters" in change:
        tj["spec"]["parameters"] = change["parameters"]
    if "volumes" in change:
        tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["volumes"] = change["volumes"]
    kubectl.apply(tj)  # the API server admits it
    wait_for(lambda: tj_status(kubectl, namespace, name).get("phase") == "Failed", TIMEOUT,
             what="phase Failed")
    failed = tj_condition(kubectl, namespace, name, "Failed")
    assert failed["status"] == "True" and failed["reason"] == reason
    assert tj_condition(kubectl, namespace, name, "Ready")["status"] == "False"
    wait_for(lambda: ("Warning", reason) in tj_events(kubectl, namespace, name), TIMEOUT,
             what=f"a {reason} event")
    assert jobs_of(kubectl, namespace, name) == []
    assert policy_of(kubectl, namespace, name) == {}


def test_fixing_a_refused_spec_creates_the_job(kubectl: Kubectl,
                                               real_operator: OperatorProcess,
                                               namespace: str) -> None:
    real_operator.start()
    tj = tj_manifest("fixme", namespace, run_for="1h")
    tj["spec"]["throttle"]["targets"] = {"cpu": {"peak": "8"}}
    kubectl.apply(tj)
    wait_for(lambda: tj_status(kubectl, namespace, "fixme").get("phase") == "Failed", TIMEOUT,
             what="phase Failed")
    patch(kubectl, namespace, "fixme", {"throttle": {"targets": {"cpu": {"peak": "1"}}}})
    wait_for(lambda: tj_status(kubectl, namespace, "fixme").get("jobName") == "fixme", TIMEOUT,
             what="status.jobName after the fix")
    assert tj_condition(kubectl, namespace, "fixme", "Failed")["status"] == "False"
    assert len(jobs_of(kubectl, namespace, "fixme")) == 1


def test_restart_over_a_stale_configmap_never_duplicates_the_job(
        kubectl: Kubectl, real_operator: OperatorProcess, namespace: str) -> None:
    """Created while the operator is down, with the ConfigMap already there (stale): as if
    the operator had been killed between creating the ConfigMap and the Job."""
    kubectl.apply(tj_manifest("restart", namespace, run_for="1h"))
    uid = kubectl.json("get", "tj", "-n", namespace, "restart")["metadata"]["uid"]
    stale = build_configmap("restart", {}, {"targets": {"cpu": {"peak": "3"}}})
    stale["metadata"].update(namespace=namespace, ownerReferences=[{
        "apiVersion": api_names.API_VERSION, "kind": api_names.KIND, "name": "restart", "uid": uid,
        "controller": True, "blockOwnerDeletion": True}])
    kubectl.apply(stale)

    real_operator.start()
    wait_for(lambda: tj_status(kubectl, namespace, "restart").get("jobName"), TIMEOUT,
             what="the Job")
    assert policy_of(kubectl, namespace, "restart")["targets"]["cpu"]["peak"] == "1500m"
    for _ in range(2):  # killed hard, then restarted: resume handlers run each time
        real_operator.kill()
        real_operator.start()
        marker = f"{real_operator.starts}00m"
        patch(kubectl, namespace, "restart", {"throttle": {"targets": {"cpu": {"peak": marker}}}})
        wait_for(lambda m=marker: policy_of(kubectl, namespace, "restart")["targets"]["cpu"][
            "peak"] == m, TIMEOUT, what="the restarted operator to handle an edit")
    assert len(jobs_of(kubectl, namespace, "restart")) == 1
    cms = kubectl.json("get", "configmaps", "-n", namespace)["items"]
    assert [c["metadata"]["name"] for c in cms if c["metadata"]["name"] != "kube-root-ca.crt"
            ] == ["restart-throttle"]


def test_inject_auto_job_has_init_container_volume_and_users_pythonpath(
        kubectl: Kubectl, real_operator: OperatorProcess, namespace: str) -> None:
    real_operator.start()
    tj = tj_manifest("zero-code", namespace, run_for="1h")
    tj["spec"]["throttle"]["inject"] = "Auto"
    tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "PYTHONPATH", "value": "/app/src"}]
    kubectl.apply(tj)
    (job,) = wait_for(lambda: jobs_of(kubectl, namespace, "zero-code"), TIMEOUT,
                      what="the Job")
    pod = job["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == [
        api_names.SIDECAR_CONTAINER, api_names.GUARD_CONTAINER, api_names.INJECT_CONTAINER]
    assert pod["initContainers"][2]["args"] == ["inject-lib", INJECT_DIR]
    assert {"name": api_names.INJECT_VOLUME, "emptyDir": {"sizeLimit": "32Mi"}} in pod["volumes"]
    (trainer,) = pod["containers"]
    assert {"name": "PYTHONPATH", "value": f"{INJECT_DIR}:/app/src"} in trainer["env"]
    assert {"name": api_names.INJECT_VOLUME, "mountPath": INJECT_DIR, "readOnly": True} \
        in trainer["volumeMounts"]
    assert "inject" not in policy_of(kubectl, namespace, "zero-code")

    # Turning it off later cannot reach the created Job: a condition says so.
    wait_for(lambda: tj_status(kubectl, namespace, "zero-code").get("jobName"), TIMEOUT,
             what="status.jobName")
    patch(kubectl, namespace, "zero-code", {"throttle": {"inject": "None"}})
    wait_for(lambda: tj_condition(kubectl, namespace, "zero-code", "TemplateApplied").get(
        "reason") == "InjectImmutable", TIMEOUT, what="TemplateApplied=False InjectImmutable")
    assert len(jobs_of(kubectl, namespace, "zero-code")) == 1
    assert ("Warning", "InjectImmutable") in tj_events(kubectl, namespace, "zero-code")
