"""The operator, its CRD, RBAC and Pod Security against a real kube-apiserver, with the
real Job, garbage-collector and namespace controllers and a KWOK node running the pods."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from testing.audit import ours_and_kopfs, writes
from testing.cluster_cli import (
    TIMEOUT,
    Kubectl,
    jobs_of,
    operator_identity,
    tj_condition,
    tj_events,
    wait_json,
)
from testing.fake_sidecar import FakeSidecar
from testing.helpers import wait_for
from testing.manifests import tj_manifest
from testing.operator_process import OperatorProcess
from testing.rbac import ADMISSION, CRDS, NAMESPACED, NAMESPACES
from throttledjob.contracts.policy import parse_policy
from throttledjob.operator import api_names
from throttledjob.operator.budget_crd import BUDGET_KIND
from throttledjob.operator.children import LABEL_NAME, owned_by


def failed_creates(kubectl: Kubectl, namespace: str) -> list[str]:
    events = kubectl.json("get", "events", "-n", namespace) or {}
    return [e.get("message", "") for e in events.get("items") or []
            if e.get("reason") == "FailedCreate"]


# Writes of one ThrottledJob's life of about 4 s (test_a_throttledjobs_life_costs_...),
# measured: ours 8 (ConfigMap, Job, 6 status patches, one of them a 409 conflict
# retried), kopf's 5 (its annotation patch, 4 events). Before a read that changed
# nothing stopped being written (observed.READ_TIME_REFRESH_SECONDS, status.as_stored), ours
# were 14-17: a status patch every read. The writes the server took are bounded apart
# from those it refused as conflicts, which race kopf's own patches and grow with the
# load: under fresh-clone CI ours once came to 11 with 9 status patches. Each refused
# write may cost kopf one event, its handler's retry's: a warm fresh-clone run read kopf's
# 7 (6 events) with 2 conflicts (2026-11-28).
OUR_WRITES_PER_LIFE = 9
KOPF_WRITES_PER_LIFE = 6
CONFLICTS_PER_LIFE = 4
STATUS_DOC = {"observed": {"cpuPeakCores": 1.48, "cpuMaxCores": 1.9,
                           "gpuPeakUtilizationPercent": None, "gpuPeakPowerWatts": None,
                           "throttleLevel": 0.4, "slowdown": 1.12},
              "targetMet": True, "budgetExhausted": False, "levers": ["pacing"], "errors": []}


@pytest.mark.parametrize("inject", ["None", "Auto"])
def test_lifecycle_on_a_real_cluster(kubectl: Kubectl, real_operator: OperatorProcess,
                                     namespace: str, pod_sidecar: FakeSidecar,
                                     inject: str) -> None:
    """Create -> ConfigMap and Job; the Job controller's pod is admitted under Pod Security
    "restricted" and runs; the operator reads its sidecar and shows what it saw in
    `kubectl get tj`; an edit reaches the ConfigMap; the Job completes and so does the
    ThrottledJob; delete -> the garbage collector removes the Job, ConfigMap and pods."""
    pod_sidecar.doc = STATUS_DOC
    real_operator.start()
    tj = tj_manifest("train", namespace, run_for="20s")
    tj["spec"]["throttle"]["inject"] = inject
    kubectl.apply(tj)

    (job,) = wait_for(lambda: jobs_of(kubectl, namespace, "train"), TIMEOUT, what="the Job")
    cm = wait_json(kubectl, bool, "configmap", "-n", namespace, "train-throttle",
                   what="the ConfigMap")
    uid = kubectl.json("get", "tj", "-n", namespace, "train")["metadata"]["uid"]
    assert owned_by(job, uid) and owned_by(cm, uid)
    assert parse_policy(yaml.safe_load(cm["data"]["policy.yaml"])).cpu_peak_cores == 1.5

    pods = wait_json(kubectl, lambda o: any(p["status"].get("phase") == "Running"
                                            for p in o["items"]),
                     "pods", "-n", namespace, "-l", f"job-name={job['metadata']['name']}",
                     what="a Running pod")
    assert failed_creates(kubectl, namespace) == []
    init = [c["name"] for c in pods["items"][0]["spec"]["initContainers"]]
    assert api_names.SIDECAR_CONTAINER in init
    assert (api_names.INJECT_CONTAINER in init) == (inject == "Auto")

    # A pod of someone else's that carries our label (and a "sidecar" on its IP) is
    # never read: only pods the Job owns are.
    rogue = copy.deepcopy(pods["items"][0])
    rogue["metadata"] = {"name": "rogue", "namespace": namespace,
                         "labels": {LABEL_NAME: "train"}}
    rogue["spec"].pop("nodeName", None)
    rogue.pop("status", None)
    kubectl.apply(rogue)
    wait_json(kubectl, lambda o: o["status"].get("phase") == "Running", "pod", "-n",
              namespace, "rogue", what="the rogue pod Running")
    hits = pod_sidecar.hits
    tj_obj = wait_json(kubectl, lambda o: (o.get("status") or {}).get("observed")
                       and pod_sidecar.hits >= hits + 4,
                       "tj", "-n", namespace, "train", what="status.observed")
    assert tj_obj["status"]["observed"]["cpuPeakCores"] == 1.48
    assert tj_obj["status"]["observed"]["pods"] == 1
    kubectl("delete", "pod", "-n", namespace, "rogue", "--wait=false")
    assert tj_obj["status"]["observedGeneration"] == tj_obj["metadata"]["generation"]
    assert tj_condition(kubectl, namespace, "train", "TargetMet")["status"] == "True"
    # The real API server's table: the target, what was seen, whether it held.
    table = kubectl("get", "tj", "-n", namespace, "train").stdout.split("\n")
    assert table[0].split() == ["NAME", "PHASE", "CPU-TARGET", "CPU-PEAK", "TARGET-MET",
                                "SLOWDOWN", "THROTTLE", "AGE"]
    assert table[1].split()[:5] == ["train", "Running", "1500m", "1.48", "True"], table
    assert not tj_obj["metadata"].get("finalizers")  # deletion never waits for us

    # The sidecar reports the budget spent: TargetMet flips, with a Warning event.
    pod_sidecar.doc = {**STATUS_DOC, "targetMet": False, "budgetExhausted": True}
    wait_for(lambda: tj_condition(kubectl, namespace, "train", "TargetMet").get("reason")
             == "BudgetExhausted", TIMEOUT, what="TargetMet=False BudgetExhausted")
    wait_for(lambda: ("Warning", "TargetUnreachable") in tj_events(kubectl, namespace, "train"),
             TIMEOUT, what="a TargetUnreachable event")

    kubectl("patch", "tj", "-n", namespace, "train", "--type=merge",
            "-p", '{"spec":{"throttle":{"targets":{"cpu":{"peak":"900m"}}}}}')
    wait_json(kubectl, lambda o: "900m" in o["data"]["policy.yaml"],
              "configmap", "-n", namespace, "train-throttle", what="the edit in the ConfigMap")

    kubectl("wait", "--for=condition=Complete", "-n", namespace, "tj/train", "--timeout=60s")
    done = kubectl.json("get", "tj", "-n", namespace, "train")["status"]
    assert done["phase"] == "Succeeded" and done["completionTime"]
    assert done["observed"]["cpuPeakCores"] == 1.48  # kept after the pod is gone
    wait_for(lambda: ("Normal", "JobSucceeded") in tj_events(kubectl, namespace, "train"),
             TIMEOUT, what="a JobSucceeded event")
    # kopf's own log lines ("Handler 'ensure' succeeded.") are not Events: ours are.
    reasons = {reason for _, reason in tj_events(kubectl, namespace, "train")}
    assert "Logging" not in reasons and "JobCreated" in reasons, reasons
    assert len(jobs_of(kubectl, namespace, "train")) == 1

    kubectl("delete", "tj", "-n", namespace, "train")
    for kind in ("jobs", "configmaps", "pods"):
        wait_json(kubectl, lambda o: not [i for i in o["items"]
                                          if i["metadata"]["name"] != "kube-root-ca.crt"],
                  kind, "-n", namespace, what=f"{kind} collected")


def test_an_operator_whose_kubeconfig_runs_an_exec_plugin_logs_in_through_it(
        kubectl: Kubectl, real_operator: OperatorProcess, namespace: str) -> None:
    """How EKS, GKE and AKS are reached from a laptop: the kubeconfig's user is an exec
    plugin (`aws eks get-token`). Here it is a script that prints the operator's token as
    an ExecCredential, which the kubeconfig no longer holds: kopf's watch (the create
    handler runs) and our own calls (the Job is created) both log in through it."""
    config = yaml.safe_load(real_operator.kubeconfig.read_text())
    user = config["users"][0]["user"]
    token, runs = user.pop("token"), real_operator.workdir / "plugin-runs"
    credential = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {"token": token}}
    plugin = real_operator.workdir / "get-token"
    plugin.write_text(f"#!/bin/sh\necho run >> {runs}\necho '{json.dumps(credential)}'\n")
    plugin.chmod(0o755)
    user["exec"] = {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin),
                    "interactiveMode": "Never"}
    real_operator.kubeconfig.write_text(yaml.safe_dump(config))
    real_operator.start()
    kubectl.apply(tj_manifest("cloud", namespace, run_for="5s"))
    wait_for(lambda: jobs_of(kubectl, namespace, "cloud"), TIMEOUT, what="the Job")
    assert runs.read_text().count("run") >= 1


def test_operator_killed_mid_create_leaves_exactly_one_job(
        kubectl: Kubectl, real_operator: OperatorProcess, namespace: str) -> None:
    real_operator.start()
    burst = [f"burst-{i}" for i in range(5)]
    kubectl.apply(*(tj_manifest(n, namespace, run_for="1h") for n in burst))
    time.sleep(0.3)  # let it be mid-way through the burst: that is the case under test
    real_operator.kill()
    real_operator.start()
    for n in burst:
        wait_for(lambda n=n: jobs_of(kubectl, namespace, n), TIMEOUT, what=f"Job of {n}")
    # Further resyncs must not add any.
    time.sleep(3)
    assert {n: len(jobs_of(kubectl, namespace, n)) for n in burst} == {n: 1 for n in burst}


def test_operator_rides_out_an_api_server_restart(
        cluster: Any, kubectl: Kubectl, real_operator: OperatorProcess, namespace: str) -> None:
    real_operator.start()
    kubectl.apply(tj_manifest("before", namespace, run_for="1h"))
    wait_for(lambda: jobs_of(kubectl, namespace, "before"), TIMEOUT, what="the first Job")
    cluster.restart("kube-apiserver")
    kubectl.apply(tj_manifest("after", namespace, run_for="1h"))
    wait_for(lambda: jobs_of(kubectl, namespace, "after"), 120,
             what="a Job for a ThrottledJob created after the restart")
    assert real_operator.proc is not None and real_operator.proc.poll() is None
    assert len(jobs_of(kubectl, namespace, "before")) == 1
    assert len(jobs_of(kubectl, namespace, "after")) == 1


def test_a_job_is_made_once_and_never_again(
        kubectl: Kubectl, real_operator: OperatorProcess, namespace: str) -> None:
    """A Job gone after it finished (its TTL) is not made again when the operator
    resumes: that would run the work twice. One deleted while it ran fails its
    ThrottledJob, and is not made again either: JobDeleted as the watch saw it, JobGone
    where the operator was down (its end not seen)."""
    real_operator.start()
    kubectl.apply(tj_manifest("done", namespace, run_for="1s"),
                  *(tj_manifest(n, namespace, run_for="1h") for n in ("cut", "cut-live")))
    wait_json(kubectl, lambda o: (o.get("status") or {}).get("phase") == "Succeeded",
              "tj", "-n", namespace, "done", what="phase Succeeded")
    for n in ("cut", "cut-live"):
        wait_json(kubectl, lambda o: (o.get("status") or {}).get("phase") == "Running",
                  "tj", "-n", namespace, n, what=f"{n} Running")
    assert real_operator.stop() == 0
    kubectl("delete", "job", "-n", namespace, "done", "cut")
    real_operator.start()
    wait_json(kubectl, lambda o: (o.get("status") or {}).get("phase") == "Failed",
              "tj", "-n", namespace, "cut", what="cut Failed")
    kubectl("delete", "job", "-n", namespace, "cut-live")
    wait_json(kubectl, lambda o: (o.get("status") or {}).get("phase") == "Failed",
              "tj", "-n", namespace, "cut-live", what="cut-live Failed")
    for n, reason in (("cut", "JobGone"), ("cut-live", "JobDeleted")):
        failed = tj_condition(kubectl, namespace, n, "Failed")
        assert (failed["status"], failed["reason"]) == ("True", reason), failed
        assert tj_condition(kubectl, namespace, n, "Ready")["status"] == "False"
        assert ("Warning", reason) in tj_events(kubectl, namespace, n)
    time.sleep(3)   # a resync or a retry that would make one has had its chance
    assert {n: len(jobs_of(kubectl, namespace, n)) for n in ("done", "cut", "cut-live")} \
        == {"done": 0, "cut": 0, "cut-live": 0}
    assert kubectl.json("get", "tj", "-n", namespace, "done")["status"]["phase"] == "Succeeded"
    assert real_operator.stop() == 0


def test_a_job_the_api_server_refuses_fails_the_throttledjob_once(
        kubectl: Kubectl, real_operator: OperatorProcess, namespace: str) -> None:
    """A template field the operator's checks do not read, which the Job's own validation
    refuses: the ThrottledJob fails in the API server's words, and is not asked again
    (a create the server refuses would be refused again, forever)."""
    real_operator.start()
    tj = tj_manifest("refused", namespace)
    tj["spec"]["jobTemplate"]["spec"]["backoffLimit"] = -1
    kubectl.apply(tj)
    wait_json(kubectl, lambda o: (o.get("status") or {}).get("phase") == "Failed",
              "tj", "-n", namespace, "refused", what="phase Failed")
    failed = tj_condition(kubectl, namespace, "refused", "Failed")
    assert failed["reason"] == "InvalidJobTemplate" and "backoffLimit" in failed["message"]
    assert ("Warning", "InvalidJobTemplate") in tj_events(kubectl, namespace, "refused")
    time.sleep(4)   # kopf's retries of a temporary error come at 1, 2, 4 s
    assert real_operator.full_log().count("HTTP 422") == 1
    assert jobs_of(kubectl, namespace, "refused") == []


def test_a_throttledjob_made_anew_waits_for_its_predecessors_job(
        kubectl: Kubectl, real_operator: OperatorProcess, namespace: str) -> None:
    """Deleted and made anew under its name (what JobTemplateImmutable asks of a user):
    while the garbage collector has yet to remove the old Job (a finalizer holds it
    here), the new ThrottledJob waits and says so, and is not refused the name for good;
    then it gets a Job of its own, which the old Job's events do not touch."""
    real_operator.start()
    kubectl.apply(tj_manifest("again", namespace, run_for="1h"))
    (old,) = wait_for(lambda: jobs_of(kubectl, namespace, "again"), TIMEOUT, what="the Job")
    hold = '{"metadata":{"finalizers":["throttledjob.io/test-hold"]}}'
    kubectl("patch", "job", "-n", namespace, "again", "--type=merge", "-p", hold)
    kubectl("delete", "tj", "-n", namespace, "again")
    wait_json(kubectl, lambda o: o["metadata"].get("deletionTimestamp"), "job", "-n",
              namespace, "again", what="the old Job being deleted")
    kubectl.apply(tj_manifest("again", namespace, run_for="1h"))
    wait_for(lambda: tj_condition(kubectl, namespace, "again", "Ready").get("reason")
             == "WaitingForOldJob", TIMEOUT, what="Ready=False WaitingForOldJob")
    kubectl("patch", "job", "-n", namespace, "again", "--type=merge",
            "-p", '{"metadata":{"finalizers":null}}')
    (new,) = wait_for(lambda: [j for j in jobs_of(kubectl, namespace, "again")
                               if j["metadata"]["uid"] != old["metadata"]["uid"]],
                      TIMEOUT, what="the new ThrottledJob's own Job")
    tj = wait_json(kubectl, lambda o: (o.get("status") or {}).get("phase") == "Running",
                   "tj", "-n", namespace, "again", what="phase Running")
    assert owned_by(new, tj["metadata"]["uid"])
    assert tj_condition(kubectl, namespace, "again", "Ready")["status"] == "True"
    assert tj_condition(kubectl, namespace, "again", "Failed").get("status") != "True"
    assert real_operator.stop() == 0


def audited_calls(cluster: Any, user: str, namespace: str,
                  since: int) -> tuple[set[tuple[str, str, str]], list[str]]:
    """(group, resource[/subresource], verb) of every call `user` made in `namespace` or
    cluster-wide, after its first `since` calls, that RBAC allowed; and a line for each
    RBAC refused. (Earlier calls belong to other tests, one of which restarts the API
    server: its authorizer refuses everything until its caches fill.)"""
    calls, refused = set(), []
    for e in cluster.audit(user)[since:]:
        ref = e.get("objectRef") or {}
        if not ref.get("resource") or ref.get("namespace") not in (None, namespace):
            continue  # discovery, or another test's namespace
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        call = (ref.get("apiGroup", ""), resource, e["verb"])
        if (e.get("annotations") or {}).get("authorization.k8s.io/decision") == "forbid":
            refused.append(f"{call} in {ref.get('namespace')}")
        else:
            calls.add(call)
    return calls, refused


def exercise(kubectl: Kubectl, op: OperatorProcess, namespace: str) -> None:
    """A ThrottledJob's whole life: create, run, edit (under Quota: the running pod's
    limits are resized), suspend and resume, restart the operator, complete; and one
    whose ConfigMap's name is taken (read, and refused)."""
    op.start()
    kubectl.apply({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "taken-throttle", "namespace": namespace}})
    kubectl.apply(tj_manifest("taken", namespace))
    wait_for(lambda: tj_condition(kubectl, namespace, "taken", "Failed").get("reason")
             == "ConfigMapNameTaken", TIMEOUT, what="Failed ConfigMapNameTaken")
    kubectl.apply(tj_manifest("rbac", namespace, run_for="10s", throttle={
        "targets": {"cpu": {"peak": "1500m"}}, "enforcement": "Quota"}))
    wait_json(kubectl, lambda o: (o.get("status") or {}).get("observed"),
              "tj", "-n", namespace, "rbac", what="status.observed")
    # A ThrottleBudget over it, above its own target: watched, read and its status written.
    kubectl.apply({"apiVersion": api_names.API_VERSION, "kind": BUDGET_KIND,
                   "metadata": {"name": "fleet", "namespace": namespace},
                   "spec": {"cpu": {"peak": 8}}})
    wait_json(kubectl, lambda o: [m["name"] for m in (o.get("status") or {}).get("members")
                                  or []] == ["rbac"],
              "throttlebudget", "-n", namespace, "fleet", what="the budget's split")
    kubectl("patch", "tj", "-n", namespace, "rbac", "--type=merge",
            "-p", '{"spec":{"throttle":{"targets":{"cpu":{"peak":"900m"}}}}}')
    wait_json(kubectl, lambda o: "900m" in o["data"]["policy.yaml"],
              "configmap", "-n", namespace, "rbac-throttle", what="the edit")
    # The operator asks for the running pod's resize (RBAC allows it); the API server
    # refuses it, as KWOK's node does not declare in-place resize support: the refused
    # path, for real (the resize itself: tests/cluster/test_end_to_end_live.py).
    wait_for(lambda: ("Warning", "QuotaResizeRefused") in tj_events(kubectl, namespace, "rbac"),
             timeout=60, what="the resize asked for, and refused")
    for suspend, phase in (("true", "Suspended"), ("false", "Running")):
        kubectl("patch", "tj", "-n", namespace, "rbac", "--type=merge",
                "-p", f'{{"spec":{{"suspend":{suspend}}}}}')
        tj = wait_json(kubectl, lambda o, phase=phase: (o.get("status") or {}).get("phase")
                       == phase, "tj", "-n", namespace, "rbac", what=f"phase {phase}")
        # Acted on: kstatus (Flux, waits) reads a lagging observedGeneration as in progress.
        wait_json(kubectl, lambda o: o["status"].get("observedGeneration")
                  == o["metadata"]["generation"], "tj", "-n", namespace, "rbac",
                  what="status.observedGeneration of the suspend edit")
        assert tj["metadata"]["generation"] >= 2
    assert op.stop() == 0
    op.start()
    wait_json(kubectl, lambda o: (o.get("status") or {}).get("phase") == "Succeeded",
              "tj", "-n", namespace, "rbac", what="phase Succeeded")
    assert op.stop() == 0


def granted(rules: dict[tuple[str, str], frozenset[str]]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for (g, r), verbs in rules.items() for v in verbs}


def test_cluster_wide_rbac_is_exactly_what_the_operator_uses(
        cluster: Any, kubectl: Kubectl, real_operator: OperatorProcess, namespace: str,
        pod_sidecar: FakeSidecar) -> None:
    """The chart's ClusterRole, bound to the operator's real ServiceAccount token: no call
    of the operator's is refused, and every grant is used (the audit log says so)."""
    pod_sidecar.doc = STATUS_DOC
    user = real_operator.user  # type: ignore[attr-defined]
    since = len(cluster.audit(user))
    exercise(kubectl, real_operator, namespace)
    calls, refused = audited_calls(cluster, user, namespace, since)
    assert refused == []
    assert calls - granted({**NAMESPACED, **CRDS}) == set(), "calls the chart does not grant"
    assert granted({**NAMESPACED, **CRDS}) - calls - granted(ADMISSION) == set(), \
        "grants the operator never used"


def test_listed_namespaces_rbac_is_exactly_what_the_operator_uses(
        cluster: Any, kubectl: Kubectl, crd_installed: None, namespace: str, tmp_path: Path,
        pod_sidecar: FakeSidecar) -> None:
    """watchNamespaces: Roles in the listed namespaces only; the operator works there and
    is refused elsewhere."""
    pod_sidecar.doc = STATUS_DOC
    release = f"listed-{namespace}"
    kubeconfig, user, objs = operator_identity(
        cluster, kubectl, release, {"watchNamespaces": [namespace]}, tmp_path)
    assert {o["kind"] for o in objs} >= {"Role", "RoleBinding"}
    op = OperatorProcess(kubeconfig, tmp_path, scope=("-n", namespace))
    since = len(cluster.audit(user))
    try:
        exercise(kubectl, op, namespace)
    finally:
        op.stop()
    calls, refused = audited_calls(cluster, user, namespace, since)
    assert refused == []
    rules = {**NAMESPACED, **CRDS, **NAMESPACES}
    assert calls - granted(rules) == set(), "calls the chart does not grant"
    assert granted(rules) - calls - granted(ADMISSION) == set(), \
        "grants the operator never used"
    elsewhere = kubectl("auth", "can-i", "create", "jobs", "-n", "default", "--as", user,
                        check=False)
    assert elsewhere.stdout.strip() == "no", elsewhere.stdout + elsewhere.stderr
    for kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"):
        for o in objs:
            if o["kind"] == kind:
                ns = o["metadata"].get("namespace")
                kubectl("delete", kind.lower(), o["metadata"]["name"],
                        *(["-n", ns] if ns else []), "--ignore-not-found")


def test_a_pod_security_violation_is_seen_on_the_job_not_hidden(
        kubectl: Kubectl, real_operator: OperatorProcess, namespace: str) -> None:
    """The server, not our checker, judges: a workload that asks for root is refused by
    Pod Security admission in a restricted namespace (FailedCreate on the Job)."""
    real_operator.start()
    tj = tj_manifest("rooty", namespace)
    pod = tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    pod["securityContext"] = {"runAsUser": 0, "seccompProfile": {"type": "RuntimeDefault"}}
    kubectl.apply(tj)
    wait_for(lambda: jobs_of(kubectl, namespace, "rooty"), TIMEOUT, what="the Job")
    messages = wait_for(lambda: failed_creates(kubectl, namespace), TIMEOUT,
                        what="a FailedCreate event")
    assert any("violates PodSecurity" in m for m in messages), messages


def test_a_throttledjobs_life_costs_a_counted_number_of_writes(
        cluster: Any, kubectl: Kubectl, real_operator: OperatorProcess, namespace: str,
        pod_sidecar: FakeSidecar) -> None:
    """Create -> ConfigMap and Job -> its pod runs -> Succeeded, with no edit: every
    write the operator made, from the API server's audit log, ours and kopf's. One
    ConfigMap and one Job, ever; the status and kopf's annotations within the counts
    measured (docs/dev/benchmarks-history.md, "Load"), so that a change which adds writes per
    ThrottledJob shows here."""
    pod_sidecar.doc = STATUS_DOC
    user = real_operator.user  # type: ignore[attr-defined]
    since = len(cluster.audit(user))
    real_operator.start()
    kubectl.apply(tj_manifest("writes", namespace, run_for="4s"))
    wait_json(kubectl, lambda o: (o.get("status") or {}).get("phase") == "Succeeded",
              "tj", "-n", namespace, "writes", what="phase Succeeded")
    time.sleep(3)  # writes a handler may still make after it
    counts = writes(cluster, user, namespace, since)
    refused = writes(cluster, user, namespace, since, conflicts=True)
    ours, kopf = ours_and_kopfs(counts)
    print(f"writes of one ThrottledJob's life: ours {ours}, kopf's {kopf}: {counts}; "
          f"refused as conflicts: {refused}")
    assert counts[("", "configmaps", "create", "ours")] == 1, counts
    assert counts[("batch", "jobs", "create", "ours")] == 1, counts
    conflicts = sum(refused.values())
    assert ours <= OUR_WRITES_PER_LIFE, (counts, refused)
    assert kopf <= KOPF_WRITES_PER_LIFE + conflicts, (counts, refused)
    assert conflicts <= CONFLICTS_PER_LIFE, (counts, refused)
