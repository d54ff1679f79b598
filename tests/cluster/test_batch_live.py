"""Kueue and JobSet (tools/k8s/batch.py), built from their modules and run beside the
test cluster: a queued Job, and a queued JobSet, wait suspended until their ClusterQueue
has room; a JobSet makes its Jobs, its headless Service and their pods (KWOK pods:
Running, then Succeeded)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testing.attach import attach_operator
from testing.cluster_cli import Kubectl, operator_identity, tj_events, wait_json
from testing.helpers import wait_for
from testing.manifests import tj_manifest
from testing.operator_process import OperatorProcess
from throttledjob.operator import api_names
from throttledjob.operator.attach import THROTTLE_LABEL
from throttledjob.operator.budget_crd import BUDGET_KIND
from throttledjob.operator.children import LABEL_NAME
from throttledjob.operator.kueue import PRIORITY_LABEL as KUEUE_PRIORITY_LABEL
from tools.k8s.batch import JOBSET_NAME_LABEL, QUEUE_LABEL
from tools.k8s.cluster import ON_KWOK  # KWOK's node: pods go Running, then Succeeded

KUEUE_API = "kueue.x-k8s.io/v1beta2"
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
RUN_FOR = "throttledjob.io/test-run-for"  # tools/k8s/kwok-stages.yaml
TIMEOUT = 60.0


def pod_spec(cpu: str = "100m") -> dict[str, Any]:
    """A pod on KWOK's node that Pod Security "restricted" admits, asking for `cpu`."""
    return {
        **ON_KWOK,
        "restartPolicy": "Never",
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "main", "image": "localhost/none:never",
            "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}},
            "securityContext": {"allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]}}}],
    }


def queued_job(name: str, namespace: str, queue: str, cpu: str,
               run_for: str = "2s") -> dict[str, Any]:
    """A Job for the LocalQueue `queue`, not suspended: Kueue's webhook must do that."""
    template = {"metadata": {"annotations": {RUN_FOR: run_for}}, "spec": pod_spec(cpu)}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": namespace, "labels": {QUEUE_LABEL: queue}},
            "spec": {"backoffLimit": 0, "template": template}}


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == type_), {})


def jobset(name: str, namespace: str, cpu: str = "100m") -> dict[str, Any]:
    """A JobSet of two replicas of a one-pod Job."""
    return {"apiVersion": JOBSET_API, "kind": "JobSet",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicatedJobs": [{"name": "worker", "replicas": 2, "template": {"spec": {
                "parallelism": 1, "completions": 1, "backoffLimit": 0,
                "template": {"spec": pod_spec(cpu)}}}}]}}


def workload_of(kubectl: Kubectl, namespace: str, owner: str,
                kind: str = "Job") -> dict[str, Any] | None:
    """The Kueue Workload that stands for the `kind` named `owner`."""
    listed = kubectl.json("get", "workloads.kueue.x-k8s.io", "-n", namespace) or {}
    return next((w for w in listed.get("items") or []
                 if any(o.get("kind") == kind and o.get("name") == owner
                        for o in w["metadata"].get("ownerReferences") or [])), None)


def pods_of(kubectl: Kubectl, namespace: str, selector: str) -> list[dict[str, Any]]:
    return (kubectl.json("get", "pods", "-n", namespace, "-l", selector) or {}).get("items") or []


def wait_admitted(kubectl: Kubectl, namespace: str, job: str) -> None:
    """Kueue admitted the Job's Workload, unsuspended the Job, and its pod exists."""
    wait_for(lambda: condition(workload_of(kubectl, namespace, job), "Admitted")
             .get("status") == "True", TIMEOUT, 0.2, f"{job}'s Workload Admitted")
    wait_json(kubectl, lambda j: j["spec"].get("suspend") is False, "job", "-n", namespace,
              job, what=f"{job} unsuspended")
    wait_for(lambda: pods_of(kubectl, namespace, f"job-name={job}"), TIMEOUT, 0.2,
             f"a pod of {job}")


@pytest.fixture
def local_queue(batch_components: Any, kubectl: Kubectl, namespace: str) -> Iterator[str]:
    """A LocalQueue of the namespace, on a ClusterQueue of its own with room for 1 CPU
    (cluster-scoped objects, removed after the test); yields its name."""
    flavor, cluster_queue, queue = f"{namespace}-flavor", f"{namespace}-cq", "queue"
    kubectl.apply(
        {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": flavor}},
        {"apiVersion": KUEUE_API, "kind": "ClusterQueue", "metadata": {"name": cluster_queue},
         "spec": {
             "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
             "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{
                 "name": flavor, "resources": [{"name": "cpu", "nominalQuota": "1"},
                                               {"name": "memory", "nominalQuota": "1Gi"}]}]}]}},
        {"apiVersion": KUEUE_API, "kind": "LocalQueue",
         "metadata": {"name": queue, "namespace": namespace},
         "spec": {"clusterQueue": cluster_queue}})
    wait_json(kubectl, lambda q: condition(q, "Active").get("status") == "True",
              "localqueues.kueue.x-k8s.io", "-n", namespace, queue,
              what="the LocalQueue Active")
    yield queue
    for kind in ("jobs", "jobsets.jobset.x-k8s.io"):
        kubectl("delete", kind, "--all", "-n", namespace, "--wait=false", check=False)
    kubectl("delete", "localqueues.kueue.x-k8s.io", "-n", namespace, queue, "--wait=false",
            check=False)
    kubectl("delete", "clusterqueues.kueue.x-k8s.io", cluster_queue, "--wait=false",
            check=False)
    kubectl("delete", "resourceflavors.kueue.x-k8s.io", flavor, "--wait=false", check=False)


def pending_workload(kubectl: Kubectl, namespace: str, kind: str,
                     owner: str) -> dict[str, Any]:
    """The Workload of `owner` once Kueue judged it and found no room."""
    found = wait_for(
        lambda: (w := workload_of(kubectl, namespace, owner, kind)) is not None
        and condition(w, "QuotaReserved").get("status") == "False" and w,
        TIMEOUT, 0.2, f"{owner}'s Workload judged and left pending")
    assert isinstance(found, dict)
    assert "insufficient" in condition(found, "QuotaReserved").get("message", "")
    assert condition(found, "Admitted").get("status") != "True"
    return found


def test_a_queued_job_waits_suspended_until_its_cluster_queue_has_room(
        kubectl: Kubectl, namespace: str, local_queue: str) -> None:
    # The first Job takes the whole quota and keeps it (its pod runs for an hour).
    kubectl.apply(queued_job("first", namespace, local_queue, cpu="1", run_for="1h"))
    wait_admitted(kubectl, namespace, "first")

    kubectl.apply(queued_job("second", namespace, local_queue, cpu="1"))
    pending_workload(kubectl, namespace, "Job", "second")
    second = kubectl.json("get", "job", "-n", namespace, "second")
    assert second["spec"]["suspend"] is True
    assert pods_of(kubectl, namespace, "job-name=second") == []

    kubectl("delete", "job", "-n", namespace, "first", "--cascade=background")
    wait_admitted(kubectl, namespace, "second")
    wait_json(kubectl, lambda j: condition(j, "Complete").get("status") == "True",
              "job", "-n", namespace, "second", what="the second Job Complete")


def test_a_queued_jobset_waits_for_quota_then_runs(
        kubectl: Kubectl, namespace: str, local_queue: str) -> None:
    """Kueue manages JobSets too when both run: two 1-CPU pods do not fit the queue's
    1 CPU, so the JobSet stays suspended (no pods) until the quota grows."""
    obj = jobset("pair", namespace, cpu="1")
    obj["metadata"]["labels"] = {QUEUE_LABEL: local_queue}
    kubectl.apply(obj)
    pending_workload(kubectl, namespace, "JobSet", "pair")
    held = kubectl.json("get", "jobsets.jobset.x-k8s.io", "-n", namespace, "pair")
    assert held["spec"]["suspend"] is True
    assert pods_of(kubectl, namespace, f"{JOBSET_NAME_LABEL}=pair") == []

    cluster_queue = f"{namespace}-cq"
    kubectl("patch", "clusterqueues.kueue.x-k8s.io", cluster_queue, "--type", "json", "-p",
            '[{"op": "replace", "path": '
            '"/spec/resourceGroups/0/flavors/0/resources/0/nominalQuota", "value": "2"}]')
    wait_for(lambda: condition(workload_of(kubectl, namespace, "pair", "JobSet"), "Admitted")
             .get("status") == "True", TIMEOUT, 0.2, "the JobSet's Workload Admitted")
    wait_for(lambda: len(pods_of(kubectl, namespace, f"{JOBSET_NAME_LABEL}=pair")) == 2,
             TIMEOUT, 0.2, "the JobSet's two pods")
    wait_json(kubectl, lambda js: condition(js, "Completed").get("status") == "True",
              "jobsets.jobset.x-k8s.io", "-n", namespace, "pair", what="the JobSet Completed")


def test_a_jobset_makes_its_jobs_headless_service_and_pods(
        batch_components: Any, kubectl: Kubectl, namespace: str) -> None:
    name = "pair"
    kubectl.apply(jobset(name, namespace))
    selector = f"{JOBSET_NAME_LABEL}={name}"

    def jobs() -> list[str]:
        listed = kubectl.json("get", "jobs", "-n", namespace, "-l", selector) or {}
        return sorted(j["metadata"]["name"] for j in listed.get("items") or [])

    wait_for(lambda: len(jobs()) == 2, TIMEOUT, 0.2, "the JobSet's two Jobs")
    assert jobs() == [f"{name}-worker-0", f"{name}-worker-1"]

    service = wait_json(kubectl, lambda s: True, "service", "-n", namespace, name,
                        what="the JobSet's headless Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {JOBSET_NAME_LABEL: name}

    wait_for(lambda: len(pods_of(kubectl, namespace, selector)) == 2, TIMEOUT, 0.2,
             "a pod of each Job")
    pods = pods_of(kubectl, namespace, selector)
    assert {p["spec"]["subdomain"] for p in pods} == {name}
    assert sorted(p["spec"]["hostname"] for p in pods) == [f"{name}-worker-0-0",
                                                           f"{name}-worker-1-0"]
    wait_json(kubectl, lambda js: condition(js, "Completed").get("status") == "True",
              "jobsets.jobset.x-k8s.io", "-n", namespace, name,
              what="the JobSet Completed (KWOK's pods succeed)")
    assert {p["status"]["phase"] for p in pods_of(kubectl, namespace, selector)} <= {
        "Running", "Succeeded"}


# ---- ThrottledJobs queued by Kueue (operator/kueue.py, docs/operator.md) ---------------

def queued_tj(name: str, namespace: str, queue: str, run_for: str) -> dict[str, Any]:
    """A ThrottledJob for the LocalQueue `queue` whose pod asks for 600m: with the
    sidecar's requests one fits the test's 1-CPU ClusterQueue, two do not."""
    tj = tj_manifest(name, namespace, run_for=run_for, throttle={
        "targets": {"cpu": {"peak": "500m"}}, "enforcement": "Cooperative"}, **ON_KWOK)
    tj["metadata"]["labels"] = {QUEUE_LABEL: queue}
    (work,) = tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    work["resources"] = {"requests": {"cpu": "600m", "memory": "64Mi"},
                         "limits": {"cpu": "600m", "memory": "64Mi"}}
    return tj


def tj_of(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    return kubectl.json("get", "tj", "-n", namespace, name) or {}


def phase(kubectl: Kubectl, namespace: str, name: str) -> str | None:
    return (tj_of(kubectl, namespace, name).get("status") or {}).get("phase")


@pytest.fixture
def kueue_operator(batch_components: Any, kubectl: Kubectl, crd_installed: None,
                   tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator as the chart's ServiceAccount with `kueue.enabled` (Workloads list and
    patch), reading the sidecars and queues every second."""
    kubeconfig, _, _ = operator_identity(batch_components, kubectl, "kq",
                                         {"kueue": {"enabled": True}}, tmp_path)
    op = OperatorProcess(kubeconfig, tmp_path)
    op.env["THROTTLEDJOB_STATUS_INTERVAL"] = "1"
    op.start()
    yield op
    op.stop()


def test_throttledjobs_wait_in_kueues_queue_and_suspend_through_it(
        kubectl: Kubectl, namespace: str, local_queue: str,
        kueue_operator: OperatorProcess) -> None:
    """Two ThrottledJobs, room for one: the second is Queued with Kueue's reason and no
    pod until the first completes, then admitted; suspended mid-run through its Workload,
    its pods go, and resumed it finishes. A queue no LocalQueue has: Queued, Kueue's
    reason, nothing runs. One without the label runs as without Kueue."""
    kubectl.apply(queued_tj("first", namespace, local_queue, run_for="6s"))
    wait_for(lambda: phase(kubectl, namespace, "first") == "Running", TIMEOUT, 0.2,
             "the first admitted and Running")
    kubectl.apply(queued_tj("second", namespace, local_queue, run_for="8s"))
    wait_for(lambda: (c := condition(tj_of(kubectl, namespace, "second"), "Admitted"))
             .get("reason") == "Pending" and "insufficient" in c.get("message", ""),
             TIMEOUT, 0.2, "the second Queued with Kueue's reason")
    assert phase(kubectl, namespace, "second") == "Queued"
    job = kubectl.json("get", "job", "-n", namespace, "second")
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"][QUEUE_LABEL] == local_queue
    deadline = time.monotonic() + TIMEOUT
    while phase(kubectl, namespace, "first") != "Succeeded":  # no pod of it meanwhile
        assert pods_of(kubectl, namespace, "job-name=second") == []
        assert time.monotonic() < deadline, "the first never Succeeded"
    wait_for(lambda: phase(kubectl, namespace, "second") == "Running", TIMEOUT, 0.2,
             "the second admitted and Running")
    assert condition(tj_of(kubectl, namespace, "second"), "Admitted")["status"] == "True"

    kubectl("patch", "tj", "-n", namespace, "second", "--type=merge",
            "-p", '{"spec":{"suspend":true}}')
    wait_for(lambda: phase(kubectl, namespace, "second") == "Suspended"
             and not pods_of(kubectl, namespace, "job-name=second"), TIMEOUT, 0.2,
             "the second Suspended, its pods gone")
    assert workload_of(kubectl, namespace, "second")["spec"]["active"] is False
    kubectl("patch", "tj", "-n", namespace, "second", "--type=merge",
            "-p", '{"spec":{"suspend":false}}')
    wait_for(lambda: phase(kubectl, namespace, "second") == "Succeeded", TIMEOUT, 0.2,
             "the second resumed and Succeeded")

    kubectl.apply(queued_tj("lost", namespace, "nope", run_for="1s"))
    wait_for(lambda: condition(tj_of(kubectl, namespace, "lost"), "Admitted")
             .get("reason") == "Inadmissible", TIMEOUT, 0.2, "Kueue's reason for no queue")
    lost = tj_of(kubectl, namespace, "lost")
    assert lost["status"]["phase"] == "Queued"
    assert "nope" in condition(lost, "Admitted")["message"]
    assert pods_of(kubectl, namespace, "job-name=lost") == []
    # Without the label, Kueue running beside it changes nothing: no Workload, it runs.
    kubectl.apply(tj_manifest("plain", namespace, run_for="1s", **ON_KWOK))
    wait_for(lambda: phase(kubectl, namespace, "plain") == "Succeeded", TIMEOUT, 0.2,
             "the unlabelled ThrottledJob Succeeded")
    assert workload_of(kubectl, namespace, "plain") is None
    assert condition(tj_of(kubectl, namespace, "plain"), "Admitted") == {}


def test_an_indexed_throttledjob_is_admitted_whole_or_not_at_all(
        kubectl: Kubectl, namespace: str, local_queue: str,
        kueue_operator: OperatorProcess) -> None:
    """Two ranks of 600m do not fit 1 CPU: Kueue admits the Job as one workload, so
    neither rank runs (one would fit) until the quota holds both; then both do."""
    tj = queued_tj("ranks", namespace, local_queue, run_for="2s")
    tj["spec"]["jobTemplate"]["spec"].update(
        {"completionMode": "Indexed", "parallelism": 2, "completions": 2})
    kubectl.apply(tj)
    wait_for(lambda: condition(tj_of(kubectl, namespace, "ranks"), "Admitted")
             .get("reason") == "Pending", TIMEOUT, 0.2, "the ranks Queued with Kueue's reason")
    assert phase(kubectl, namespace, "ranks") == "Queued"
    assert pods_of(kubectl, namespace, "job-name=ranks") == []
    kubectl("patch", "clusterqueues.kueue.x-k8s.io", f"{namespace}-cq", "--type", "json", "-p",
            '[{"op": "replace", "path": '
            '"/spec/resourceGroups/0/flavors/0/resources/0/nominalQuota", "value": "2"}]')
    wait_for(lambda: len(pods_of(kubectl, namespace, "job-name=ranks")) == 2, TIMEOUT, 0.2,
             "both ranks' pods")
    wait_for(lambda: phase(kubectl, namespace, "ranks") == "Succeeded", TIMEOUT, 0.2,
             "the ranks Succeeded")


def test_kueue_counts_a_throttledjob_at_its_target_not_its_templates_limit(
        kubectl: Kubectl, namespace: str, local_queue: str,
        kueue_operator: OperatorProcess) -> None:
    """Two ThrottledJobs whose templates ask 900m each (limits alone, as most do) held to
    400m by the kernel's quota: the Job carries the target as its limit, so Kueue counts
    400m and the sidecar's requests for each, and a 1-CPU queue admits both at once; by
    their templates one alone would fit."""
    for name in ("a", "b"):
        tj = tj_manifest(name, namespace, run_for="8s", throttle={
            "targets": {"cpu": {"peak": "400m"}}, "enforcement": "Quota"}, **ON_KWOK)
        tj["metadata"]["labels"] = {QUEUE_LABEL: local_queue}
        (work,) = tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
        work["resources"] = {"limits": {"cpu": "900m", "memory": "64Mi"}}
        kubectl.apply(tj)
    wait_for(lambda: [phase(kubectl, namespace, n) for n in ("a", "b")]
             == ["Running", "Running"], TIMEOUT, 0.2, "both admitted and Running at once")
    usage = condition(workload_of(kubectl, namespace, "a"), "Admitted") and \
        workload_of(kubectl, namespace, "a")["status"]["admission"]["podSetAssignments"][0][
            "resourceUsage"]["cpu"]
    assert usage == "455m", usage  # 400m of work, the sidecar's 50m and the guard's 5m


def test_a_budget_its_floors_pass_suspends_its_lowest_priority_member_through_kueue(
        kubectl: Kubectl, namespace: str, local_queue: str,
        kueue_operator: OperatorProcess) -> None:
    """A ThrottleBudget with floorsOverBudget: Suspend over two queued ThrottledJobs, each
    with a floor (its 300m request) that fits its 500m alone: the first runs; once a
    second of higher priority (its WorkloadPriorityClass's 100) comes, the floors pass
    the budget and the first is suspended through its Workload, its pods gone, the
    second running; the budget raised, the first is resumed and runs."""
    priority_class = f"{namespace}-high"
    kubectl.apply({"apiVersion": KUEUE_API, "kind": "WorkloadPriorityClass",
                   "metadata": {"name": priority_class}, "value": 100})
    kubectl.apply({"apiVersion": api_names.API_VERSION, "kind": BUDGET_KIND,
                   "metadata": {"name": "team-a", "namespace": namespace},
                   "spec": {"selector": {"matchLabels": {"team": "a"}},
                            "cpu": {"peak": "500m"}, "floorsOverBudget": "Suspend"}})

    def member(name: str, labels: dict[str, str]) -> dict[str, Any]:
        tj = queued_tj(name, namespace, local_queue, run_for="40s")
        tj["metadata"]["labels"].update(team="a", **labels)
        tj["spec"]["throttle"]["targets"]["cpu"]["peak"] = "400m"
        (work,) = tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
        work["resources"] = {"requests": {"cpu": "300m", "memory": "64Mi"},
                             "limits": {"cpu": "400m", "memory": "64Mi"}}
        return tj

    try:
        kubectl.apply(member("low", {}))
        wait_for(lambda: phase(kubectl, namespace, "low") == "Running", TIMEOUT, 0.2,
                 "the first member Running")
        kubectl.apply(member("high", {KUEUE_PRIORITY_LABEL: priority_class}))
        budget = wait_json(
            kubectl, lambda b: (b.get("status") or {}).get("suspended") == ["low"]
            and condition(tj_of(kubectl, namespace, "low"), "Admitted").get("reason")
            == "Deactivated" and not pods_of(kubectl, namespace, "job-name=low")
            and phase(kubectl, namespace, "high") == "Running",
            "throttlebudget", "-n", namespace, "team-a", timeout=TIMEOUT,
            what="the lower-priority member suspended, its pods gone, the other running")
        assert condition(budget, "BudgetMet")["reason"] == "MembersSuspended", budget
        assert [(m["name"], m["priority"]) for m in budget["status"]["members"]] == [
            ("high", 100)]  # its WorkloadPriorityClass's value, through its Workload
        # Held by Kueue, deactivated: Queued, and the event says by what.
        assert phase(kubectl, namespace, "low") == "Queued"
        assert workload_of(kubectl, namespace, "low")["spec"]["active"] is False
        assert ("Normal", "SuspendRequested") in tj_events(kubectl, namespace, "low")
        kubectl("patch", "throttlebudget", "-n", namespace, "team-a", "--type=merge",
                "-p", '{"spec":{"cpu":{"peak":"1"}}}')
        wait_for(lambda: phase(kubectl, namespace, "low") == "Running"
                 and phase(kubectl, namespace, "high") == "Running", TIMEOUT, 0.2,
                 "the suspended member resumed once both floors fit")
        assert workload_of(kubectl, namespace, "low")["spec"]["active"] is True
    finally:
        kubectl("delete", "workloadpriorityclasses.kueue.x-k8s.io", priority_class,
                "--wait=false", check=False)


def test_a_queued_job_joined_by_label_is_throttled_as_kueue_lets_its_pod_start(
        batch_components: Any, kubectl: Kubectl, crd_installed: None, namespace: str,
        local_queue: str, tmp_path: Path) -> None:
    """Attach mode under Kueue: a Job that carries Kueue's queue label and ours (as a
    CronJob's jobTemplate would give it) waits suspended in the queue as any other;
    once admitted, its pod is throttled by the webhook as the Job controller makes it,
    and the Job and its Workload stay Kueue's and their maker's."""
    with attach_operator(batch_components, kubectl, namespace, tmp_path, "kqa",
                         {"kueue": {"enabled": True}}) as op:
        op.env["THROTTLEDJOB_STATUS_INTERVAL"] = "1"
        op.start()
        tj = tj_manifest("etl", namespace, throttle={
            "targets": {"cpu": {"peak": "300m"}}, "enforcement": "Quota"})
        del tj["spec"]["jobTemplate"]
        tj["spec"]["labeledWorkloads"] = {}
        kubectl.apply(tj)
        wait_for(lambda: phase(kubectl, namespace, "etl") == "Running", TIMEOUT, 0.2,
                 "the labeled ThrottledJob Running")
        job = queued_job("nightly-1", namespace, local_queue, cpu="200m", run_for="1h")
        job["metadata"]["labels"][THROTTLE_LABEL] = "etl"
        kubectl.apply(job)
        wait_admitted(kubectl, namespace, "nightly-1")
        (pod,) = pods_of(kubectl, namespace, "job-name=nightly-1")
        assert pod["metadata"]["labels"][LABEL_NAME] == "etl"
        assert api_names.SIDECAR_CONTAINER in [c["name"] for c in pod["spec"]["initContainers"]]
        (main,) = pod["spec"]["containers"]
        assert main["resources"]["limits"]["cpu"] == "300m"  # the target, the kernel's
        assert main["resources"]["requests"]["cpu"] == "200m"  # its maker's, as admitted
        wait_for(lambda: condition(tj_of(kubectl, namespace, "etl"), "PodsThrottled")
                 .get("status") == "True", TIMEOUT, 0.2, "PodsThrottled True")
        made = kubectl.json("get", "job", "-n", namespace, "nightly-1")
        assert made["metadata"]["labels"] == job["metadata"]["labels"]
        assert workload_of(kubectl, namespace, "nightly-1")["spec"].get("active", True)
