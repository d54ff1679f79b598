"""Attach mode on a real API server: a ThrottledJob that names a Job someone else made
(or whose name a CronJob's Jobs carry in their throttle label) throttles its pods as the
API server creates them, through the operator's mutating admission webhook (a real
MutatingWebhookConfiguration calling it, failurePolicy Ignore); the Job itself is left as
its maker wrote it; with the webhook down a pod starts unthrottled and the ThrottledJob
says which. The operator runs with the chart's RBAC for attach mode, so the real
authorizer judges each of its calls. The pods run on the KWOK node."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from testing.attach import attach_operator
from testing.cluster_cli import (
    OPERATOR_NAMESPACE,
    TIMEOUT,
    Kubectl,
    tj_condition,
    tj_events,
    wait_json,
)
from testing.helpers import wait_for
from testing.manifests import tj_manifest
from throttledjob.operator import api_names
from throttledjob.operator.attach import THROTTLE_LABEL
from throttledjob.operator.children import LABEL_NAME

RELEASE = "tja"


def user_job(name: str, namespace: str) -> dict[str, Any]:
    """A plain Job, as its maker writes it: no throttle, no label of ours."""
    template = tj_manifest("x", namespace, run_for="120s")["spec"]["jobTemplate"]
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": namespace},
            # Room for a pod deleted to be made anew.
            "spec": {**template["spec"], "parallelism": 1, "completions": 2,
                     "backoffLimit": 2}}


def attached(name: str, namespace: str, job: str) -> dict[str, Any]:
    tj = tj_manifest(name, namespace)
    del tj["spec"]["jobTemplate"]
    tj["spec"]["workloadRef"] = {"apiVersion": "batch/v1", "kind": "Job", "name": job}
    tj["spec"]["throttle"]["enforcement"] = "Quota"
    return tj


def user_cronjob(name: str, namespace: str, throttle: str) -> dict[str, Any]:
    """A CronJob whose Jobs join the ThrottledJob `throttle` by one label on its
    jobTemplate (suspended: the test makes its Jobs itself, as `kubectl create job
    --from` does)."""
    job = user_job(name, namespace)
    return {"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"schedule": "0 0 1 1 *", "suspend": True, "jobTemplate": {
                "metadata": {"labels": {THROTTLE_LABEL: throttle}},
                "spec": {**job["spec"], "completions": 1}}}}


def by_label(name: str, namespace: str) -> dict[str, Any]:
    tj = attached(name, namespace, "")
    del tj["spec"]["workloadRef"]
    tj["spec"]["labeledWorkloads"] = {}
    return tj


def pods(kubectl: Kubectl, namespace: str, job: str = "user-job") -> list[dict[str, Any]]:
    return (kubectl.json("get", "pods", "-n", namespace, "-l",
                         f"batch.kubernetes.io/job-name={job}") or {}).get("items") or []


def sidecar(pod: dict[str, Any]) -> bool:
    return any(c["name"] == api_names.SIDECAR_CONTAINER
               for c in pod["spec"].get("initContainers") or [])


def test_a_job_someone_else_made_is_throttled_by_admission(
        cluster: Any, kubectl: Kubectl, crd_installed: None, namespace: str,
        tmp_path: Path) -> None:
    with attach_operator(cluster, kubectl, namespace, tmp_path, RELEASE) as real_operator:
        config = real_operator.env["THROTTLEDJOB_WEBHOOK_CONFIG"]
        secret = real_operator.env["THROTTLEDJOB_WEBHOOK_SECRET"].split("/")[1]
        real_operator.start()
        # The CA the operator made is in the configuration, and is the Secret's.
        hook = wait_json(kubectl, lambda o: o["webhooks"][0]["clientConfig"].get("caBundle"),
                         "mutatingwebhookconfiguration", config, what="the caBundle")
        kept = kubectl.json("get", "secret", "-n", OPERATOR_NAMESPACE, secret)
        assert base64.b64decode(hook["webhooks"][0]["clientConfig"]["caBundle"]) == \
            base64.b64decode(kept["data"]["ca.crt"])

        # A reference to a Job not made yet: Pending, and why.
        kubectl.apply(attached("hold", namespace, "user-job"))
        ready = wait_for(lambda: tj_condition(kubectl, namespace, "hold", "Ready"), TIMEOUT,
                         what="Ready")
        assert ready["status"] == "False" and ready["reason"] == "WorkloadNotFound"

        # The Job made by someone else: its pod is throttled as it is created.
        kubectl.apply(user_job("user-job", namespace))
        (pod,) = wait_for(lambda: pods(kubectl, namespace), TIMEOUT, what="the Job's pod")
        pod_names = [pod["metadata"]["name"]]
        assert sidecar(pod) and pod["metadata"]["labels"][LABEL_NAME] == "hold"
        workload = next(c for c in pod["spec"]["containers"] if c["name"] == "trainer")
        assert workload["resources"]["limits"]["cpu"] == "1500m"  # the target, the kernel's
        job = kubectl.json("get", "job", "-n", namespace, "user-job")
        assert LABEL_NAME not in (job["metadata"].get("labels") or {})
        assert not job["metadata"].get("ownerReferences")
        status = wait_json(kubectl, lambda o: (o.get("status") or {}).get("phase") == "Running",
                           "tj", "-n", namespace, "hold", what="Running")["status"]
        assert status["jobName"] == "user-job"
        assert tj_condition(kubectl, namespace, "hold", "Ready")["reason"] == "Attached"
        wait_for(lambda: tj_condition(kubectl, namespace, "hold", "PodsThrottled").get(
            "status") == "True", TIMEOUT, what="PodsThrottled True")

        # By label: a CronJob's Jobs join a standing ThrottledJob by one label on the
        # CronJob's jobTemplate.
        kubectl.apply(by_label("etl", namespace), user_cronjob("nightly", namespace, "etl"))
        wait_json(kubectl, lambda o: (o.get("status") or {}).get("phase") == "Running",
                  "tj", "-n", namespace, "etl", what="the labeled one Running")
        kubectl("create", "job", "-n", namespace, "--from=cronjob/nightly", "nightly-1")
        (labeled,) = wait_for(lambda: pods(kubectl, namespace, "nightly-1"), TIMEOUT,
                              what="the CronJob's pod")
        assert sidecar(labeled) and labeled["metadata"]["labels"][LABEL_NAME] == "etl"
        assert tj_condition(kubectl, namespace, "etl", "Ready")["reason"] == "Attached"

        # The webhook down: the next pods start all the same, unthrottled (Ignore).
        real_operator.stop()
        kubectl("patch", "job", "-n", namespace, "user-job", "--type", "merge",
                "-p", '{"spec": {"parallelism": 2}}')
        kubectl("create", "job", "-n", namespace, "--from=cronjob/nightly", "nightly-2")
        both = wait_for(lambda: len(p := pods(kubectl, namespace)) == 2 and p, TIMEOUT,
                        what="the second pod")
        (bare,) = [p for p in both if not sidecar(p)]
        (bare_labeled,) = wait_for(lambda: pods(kubectl, namespace, "nightly-2"), TIMEOUT,
                                   what="the CronJob's second pod")
        assert not sidecar(bare_labeled)
        real_operator.start()
        for tj, pod in (("hold", bare), ("etl", bare_labeled)):
            said = wait_for(lambda tj=tj: (c := tj_condition(kubectl, namespace, tj,
                                                             "PodsThrottled"))
                            .get("status") == "False" and c, TIMEOUT,
                            what=f"{tj}: PodsThrottled False")
            assert said["reason"] == "PodsNotThrottled"
            assert pod["metadata"]["name"] in said["message"], said
            assert ("Warning", "PodsNotThrottled") in tj_events(kubectl, namespace, tj)

        # What the condition says to do: the pod deleted, the Job makes it anew, and the
        # restarted webhook throttles it, once; then every pod has the throttle.
        kubectl("delete", "pod", "-n", namespace, bare["metadata"]["name"], "--wait=false")
        new = wait_for(lambda: [p for p in pods(kubectl, namespace) if p["metadata"]["name"]
                                not in (bare["metadata"]["name"], *pod_names)], TIMEOUT,
                       what="the pod made anew")
        assert [c["name"] for c in new[0]["spec"]["initContainers"]].count(
            api_names.SIDECAR_CONTAINER) == 1
        wait_for(lambda: tj_condition(kubectl, namespace, "hold", "PodsThrottled").get(
            "status") == "True", TIMEOUT, what="PodsThrottled True again")
