"""Attach mode without a cluster: which ThrottledJob claims a new pod, the patch that
makes it a throttled one (the template mode's builder on the pod itself), the webhook's
answers (failing open), and its certificate. tests/cluster/test_attach_live.py runs the
same on the real API server."""

from __future__ import annotations

import base64
import copy
import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

import pytest

from testing.builders import SETTINGS, built, pod_of
from testing.manifests import make_tj
from throttledjob.operator import admission, webhook_certs
from throttledjob.operator.attach import THROTTLE_LABEL, Owner, claimants
from throttledjob.operator.fleet import Fleet
from throttledjob.operator.validation import SpecError, validate

JOB_REF = {"apiVersion": "batch/v1", "kind": "Job", "name": "user-job"}


def attached_tj(name: str = "hold", ref: Mapping[str, Any] = JOB_REF,
                created: str = "2026-12-07T10:00:00Z", **throttle: Any) -> dict[str, Any]:
    tj = make_tj(name, throttle={"targets": {"cpu": {"peak": "1500m"}}, "maxSlowdown": 1.25,
                                 "enforcement": "Quota", **throttle})
    del tj["spec"]["jobTemplate"]
    tj["spec"]["workloadRef"] = dict(ref)
    tj["metadata"].update(creationTimestamp=created, uid=f"uid-{name}")
    return tj


def api_defaults(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """What the API server does to a pod before any webhook: a request where only a
    limit is given is the limit."""
    for c in pod_spec["containers"]:
        res = c.get("resources") or {}
        for name, value in (res.get("limits") or {}).items():
            res.setdefault("requests", {}).setdefault(name, value)
    return pod_spec


def user_pod(owner: str = "user-job", **spec: Any) -> dict[str, Any]:
    """A pod as the Job controller sends it to admission: the template plus its owner,
    defaulted by the API server."""
    pod = copy.deepcopy(make_tj("x", **spec)["spec"]["jobTemplate"]["spec"]["template"])
    api_defaults(pod["spec"])
    pod["metadata"] = {"generateName": f"{owner}-", "namespace": "ml", "labels": {"a": "b"},
                       "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                            "name": owner, "uid": "j1", "controller": True}]}
    return pod


class FakeCluster:
    """The API as the webhook reads it: owner objects by (kind, name), the namespace's
    ThrottledJobs; `broken` makes every read fail."""

    def __init__(self, tjs: list[dict[str, Any]], owners: dict[tuple[str, str], dict] | None = None,
                 broken: bool = False) -> None:
        self.tjs, self.owners, self.broken = tjs, owners or {}, broken
        self.reads = 0  # owners read

    def owner(self, namespace: str, owner: Owner) -> Mapping[str, Any] | None:
        if self.broken:
            raise OSError("connection refused")
        self.reads += 1
        return self.owners.get((owner.kind, owner.name))

    def attached(self, namespace: str) -> list[Mapping[str, Any]]:
        return self.tjs


def answer(pod: dict[str, Any], cluster: FakeCluster, operation: str = "CREATE",
           fleet: Fleet | None = None) -> dict:
    doc = {"request": {"uid": "r1", "operation": operation, "namespace": "ml", "object": pod}}
    return admission.respond(doc, cluster, SETTINGS, fleet)["response"]


def patched(pod: dict[str, Any], response: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON patch applied as the API server applies it: each op an "add" of one
    field of metadata or spec (the only kind the webhook sends)."""
    out = copy.deepcopy(pod)
    for op in json.loads(base64.b64decode(response["patch"])):
        _, part, key = op["path"].split("/")
        assert op["op"] == "add" and part in ("metadata", "spec"), op
        out[part][key.replace("~1", "/").replace("~0", "~")] = op["value"]
    return out


def test_a_pod_of_a_budgets_member_is_made_at_its_share_not_its_own_target() -> None:
    """A ThrottleBudget splits a new member in when the ThrottledJob is made (before its
    workload's pods), so they start at the share, not at 1500m until the next pass."""
    fleet = Fleet()
    fleet.set_share(("ml", "hold"), "team-a", 0.6)
    pod = patched(user_pod(), answer(user_pod(), FakeCluster([attached_tj()]), fleet=fleet))
    assert pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "600m"
    # Another namespace's member of the same name is not this one.
    other = Fleet()
    other.set_share(("elsewhere", "hold"), "team-a", 0.6)
    pod = patched(user_pod(), answer(user_pod(), FakeCluster([attached_tj()]), fleet=other))
    assert pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "1500m"


def test_the_patch_makes_the_pod_the_template_mode_would_make() -> None:
    """One builder for both modes: the attached pod equals the pod of the Job the
    template mode builds from the same pod spec and throttle, but for what is the
    workload's (its own labels, its owner) and the service account token (theirs)."""
    tj = attached_tj()
    response = answer(user_pod(), FakeCluster([tj]))
    assert response["allowed"] and response["patchType"] == "JSONPatch"
    pod = patched(user_pod(), response)
    template = make_tj("hold", throttle=tj["spec"]["throttle"])
    job, _ = built(template)
    expected = api_defaults(copy.deepcopy(pod_of(job)))
    expected.pop("automountServiceAccountToken")
    assert pod["spec"] == expected
    assert pod["metadata"]["labels"]["throttledjob.io/name"] == "hold"
    assert pod["metadata"]["labels"]["a"] == "b"
    # The kernel's quota holds the target: the workload's limit is the target, and the
    # request the API server defaulted from the old limit follows it.
    assert pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "1500m"
    assert pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1500m"


def test_a_request_the_user_set_stays_and_one_over_the_target_is_not_throttled() -> None:
    """A request the user wrote (not the limit's default) is theirs: under the target it
    stays; over it the limits cannot be set (a limit may not be under its request), and
    the pods' policy says the kernel holds the target: the pod starts unthrottled, and
    its maker is told why."""
    tj = attached_tj()
    pod = user_pod()
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "500m"
    out = patched(pod, answer(pod, FakeCluster([tj])))["spec"]["containers"][0]
    assert out["resources"]["limits"]["cpu"] == "1500m"
    assert out["resources"]["requests"]["cpu"] == "500m"
    pod = user_pod()
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1800m"},
                                                 "limits": {"cpu": "2"}}
    response = answer(pod, FakeCluster([tj]))
    assert response["allowed"] and "patch" not in response
    assert "requests 1.8 CPU" in response["warnings"][0]


def test_a_pod_through_a_chain_of_owners_is_claimed() -> None:
    """A TrainJob's pod: Job -> JobSet -> TrainJob; the reference names the TrainJob in
    another version of its group."""
    ref = {"apiVersion": "trainer.kubeflow.org/v1beta1", "kind": "TrainJob", "name": "llm"}
    owners = {("Job", "llm-node-0"): {"metadata": {"ownerReferences": [
                  {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "llm",
                   "controller": True}]}},
              ("JobSet", "llm"): {"metadata": {"ownerReferences": [
                  {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                   "name": "llm", "controller": True}]}}}
    response = answer(user_pod("llm-node-0"), FakeCluster([attached_tj(ref=ref)], owners))
    assert "patch" in response


@pytest.mark.parametrize("pod,why", [
    (user_pod("someone-elses"), "owned by another Job"),
    ({**user_pod(), "metadata": {"namespace": "ml"}}, "no owner"),
])
def test_a_pod_no_throttledjob_names_is_left_alone(pod: dict, why: str) -> None:
    response = answer(pod, FakeCluster([attached_tj()]))
    assert response == {"uid": "r1", "allowed": True}, why


def test_where_no_throttledjob_is_attached_no_owner_is_read() -> None:
    """Most pods the webhook sees are in namespaces with no attached ThrottledJob: one
    read (the list) each, not one per owner."""
    template_mode = make_tj("plain")
    cluster = FakeCluster([template_mode], {("Job", "user-job"): {"metadata": {}}})
    assert answer(user_pod(), cluster) == {"uid": "r1", "allowed": True}
    assert cluster.reads == 0
    cluster.tjs.append(attached_tj())
    assert "patch" in answer(user_pod(), cluster) and cluster.reads == 1


def test_a_pod_throttled_already_is_left_alone() -> None:
    """A template mode pod, or one admitted twice (a reinvocation): never a second sidecar."""
    pod = patched(user_pod(), answer(user_pod(), FakeCluster([attached_tj()])))
    assert answer(pod, FakeCluster([attached_tj()])) == {"uid": "r1", "allowed": True}


def test_two_claims_the_oldest_wins() -> None:
    older = attached_tj("older", created="2026-12-07T09:00:00Z")
    newer = attached_tj("newer", created="2026-12-07T10:00:00Z")
    owners = [Owner("batch/v1", "Job", "user-job")]
    assert [t["metadata"]["name"] for t in claimants(owners, None, [newer, older])] == \
        ["older", "newer"]
    pod = patched(user_pod(), answer(user_pod(), FakeCluster([newer, older])))
    assert pod["metadata"]["labels"]["throttledjob.io/name"] == "older"


def labeled_tj(name: str = "etl", created: str = "2026-12-07T10:00:00Z") -> dict[str, Any]:
    tj = attached_tj(name, created=created)
    del tj["spec"]["workloadRef"]
    tj["spec"]["labeledWorkloads"] = {}
    return tj


def test_a_pod_whose_job_carries_the_label_is_claimed_by_that_throttledjob_alone() -> None:
    """A CronJob's Job: the label is on the Job (the jobTemplate's), not on its pods."""
    jobs = {("Job", "nightly-29"): {"metadata": {
        "labels": {THROTTLE_LABEL: "etl"}, "ownerReferences": [
            {"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly",
             "controller": True}]}}}
    tjs = [labeled_tj("other", created="2026-12-07T09:00:00Z"), labeled_tj("etl")]
    pod = patched(user_pod("nightly-29"), answer(user_pod("nightly-29"),
                                                 FakeCluster(tjs, jobs)))
    assert pod["metadata"]["labels"]["throttledjob.io/name"] == "etl"
    # Labeled on the pod itself: the same.
    own = user_pod("unlabeled-job")
    own["metadata"]["labels"][THROTTLE_LABEL] = "etl"
    assert "patch" in answer(own, FakeCluster(tjs))
    # No label, or one naming no ThrottledJob of the namespace: left alone.
    assert "patch" not in answer(user_pod("nightly-29"), FakeCluster(tjs))
    jobs[("Job", "nightly-29")]["metadata"]["labels"][THROTTLE_LABEL] = "nobody"
    assert "patch" not in answer(user_pod("nightly-29"), FakeCluster(tjs, jobs))
    # A workloadRef ThrottledJob of another name is not claimed by a label naming it.
    jobs[("Job", "nightly-29")]["metadata"]["labels"][THROTTLE_LABEL] = "hold"
    assert "patch" not in answer(user_pod("nightly-29"), FakeCluster([attached_tj()], jobs))


def test_it_fails_open_on_any_error() -> None:
    """The API not answering: allowed, no patch, a warning that says why."""
    response = answer(user_pod(), FakeCluster([attached_tj()], broken=True))
    assert response["allowed"] and "patch" not in response
    assert "connection refused" in response["warnings"][0]


def test_a_pod_the_throttle_cannot_hold_starts_unthrottled_and_says_why() -> None:
    """A pod that uses a name the sidecar needs: the template mode would refuse the
    ThrottledJob; here the pod starts, unthrottled, and its maker is told."""
    pod = user_pod()
    pod["spec"]["volumes"] = [{"name": "throttledjob-shared", "emptyDir": {}}]
    response = answer(pod, FakeCluster([attached_tj()]))
    assert response["allowed"] and "patch" not in response
    assert "cannot throttle it" in response["warnings"][0]


def test_only_pod_creation_is_mutated() -> None:
    assert "patch" not in answer(user_pod(), FakeCluster([attached_tj()]), "UPDATE")


@pytest.mark.parametrize("spec,message", [
    ({"workloadRef": JOB_REF, "jobTemplate": {}}, "exactly one of"),
    ({"workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d"}},
     "Job, a JobSet or a TrainJob"),
    ({"workloadRef": {**JOB_REF, "namespace": "theirs"}}, "only to a workload in its own"),
])
def test_refused_references(spec: dict, message: str) -> None:
    tj = attached_tj()
    tj["spec"] = {**{k: v for k, v in tj["spec"].items() if k != "workloadRef"}, **spec}
    with pytest.raises(SpecError, match=message):
        validate(tj, jobsets=True)


def test_its_own_namespace_may_be_named() -> None:
    tj = attached_tj()
    tj["spec"]["workloadRef"]["namespace"] = tj["metadata"]["namespace"]
    assert validate(tj)["targets"]


def test_scope_job_is_refused_by_label_alone() -> None:
    """A label gathers pods of any number of workloads: no one job to split among."""
    by_label = labeled_tj()
    by_label["spec"]["throttle"]["scope"] = "Job"
    with pytest.raises(SpecError, match="scope must be Pod"):
        validate(by_label)
    assert validate(labeled_tj())["targets"]
    assert validate(attached_tj(scope="Job"))["targets"]


def cpu_limit(pod: dict[str, Any]) -> str:
    return next(c for c in pod["spec"]["containers"]
                if c["name"] == "trainer")["resources"]["limits"]["cpu"]


def test_scope_job_starts_each_pod_at_its_share_of_the_workloads_ranks() -> None:
    """The job-wide target over the pods the workload runs at once, read from it: a
    Job's parallelism; a TrainJob's JobSet (of its name), every replicatedJob's pods."""
    job = {"kind": "Job", "metadata": {"name": "user-job"}, "spec": {"parallelism": 3}}
    response = answer(user_pod(), FakeCluster([attached_tj(scope="Job")],
                                              {("Job", "user-job"): job}))
    assert cpu_limit(patched(user_pod(), response)) == "500m"  # 1500m over 3

    ref = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "llm"}
    owners = {("Job", "llm-node-0"): {"kind": "Job", "metadata": {"ownerReferences": [
                  {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "llm",
                   "controller": True}]}, "spec": {"parallelism": 1}},
              ("JobSet", "llm"): {"kind": "JobSet", "metadata": {"name": "llm", "ownerReferences": [
                  {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                   "name": "llm", "controller": True}]}, "spec": {
                  "replicatedJobs": [{"name": "node", "replicas": 1,
                                      "template": {"spec": {"parallelism": 2}}},
                                     {"name": "launcher", "replicas": 1,
                                      "template": {"spec": {}}}]}}}
    pod = user_pod("llm-node-0")
    tj = attached_tj(ref=ref, scope="Job")
    response = answer(pod, FakeCluster([tj], owners))
    assert cpu_limit(patched(pod, response)) == "500m"  # 1500m over 2 + 1
    # The workload not readable: the whole target, until the split's first read.
    response = answer(user_pod(), FakeCluster([attached_tj(scope="Job")]))
    assert cpu_limit(patched(user_pod(), response)) == "1500m"


def test_a_trainjob_needs_the_jobset_support() -> None:
    ref = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "t"}
    with pytest.raises(SpecError, match="JobSet support"):
        validate(attached_tj(ref=ref), jobsets=False)
    assert validate(attached_tj(ref=ref), jobsets=True)["targets"]


def test_the_certificate_is_for_its_hosts_and_renewed_before_it_ends() -> None:
    now = dt.datetime(2026, 12, 7, tzinfo=dt.timezone.utc)
    pair = webhook_certs.make_pair(["svc.ns.svc", "127.0.0.1"], now)
    assert not webhook_certs.due(pair.cert, ["svc.ns.svc", "127.0.0.1"], now)
    assert webhook_certs.due(pair.cert, ["other.ns.svc"], now)
    late = now + dt.timedelta(days=webhook_certs.VALID_DAYS - webhook_certs.RENEW_BEFORE_DAYS + 1)
    assert webhook_certs.due(pair.cert, ["svc.ns.svc"], late)
    assert webhook_certs.due(b"not a certificate", ["svc.ns.svc"], now)
