"""The ThrottledJob's child as a JobSet (spec.jobSetTemplate) beside a Job: every pod
template made a throttled one, the JobSet's status read as a Job's, its own pods told
from others', and exactly one of the two kinds."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from testing.manifests import make_tj
from throttledjob.operator import child
from throttledjob.operator.api_names import SIDECAR_CONTAINER
from throttledjob.operator.children import LABEL_NAME, build_child
from throttledjob.operator.conditions import status_from_job
from throttledjob.operator.config import OperatorSettings
from throttledjob.operator.pod_limits import job_ranks
from throttledjob.operator.validation import SpecError, validate


def jobset_tj(**throttle: Any) -> dict[str, Any]:
    """A ThrottledJob of a JobSet: a driver and two worker replicas of one pod each."""
    tj = make_tj(throttle={"targets": {"cpu": {"peak": "1"}}, **throttle})
    job = tj["spec"].pop("jobTemplate")
    worker = copy.deepcopy(job)
    worker["spec"]["template"]["spec"]["containers"][0].update(name="worker", resources={})
    tj["spec"]["jobSetTemplate"] = {
        "metadata": {"labels": {"team": "vision"}},
        "spec": {"replicatedJobs": [{"name": "driver", "replicas": 1, "template": job},
                                    {"name": "worker", "replicas": 2, "template": worker}]}}
    return tj


def test_every_pod_template_of_a_jobset_gets_the_sidecar_and_its_share() -> None:
    tj = jobset_tj(scope="Job")
    js = build_child(tj, validate(tj, jobsets=True), OperatorSettings())
    assert (js["apiVersion"], js["kind"], js["metadata"]["name"]) == (
        "jobset.x-k8s.io/v1alpha2", "JobSet", "train")
    assert js["metadata"]["labels"][LABEL_NAME] == "train"
    for replicated in js["spec"]["replicatedJobs"]:
        pod = replicated["template"]["spec"]["template"]
        assert pod["metadata"]["labels"][LABEL_NAME] == "train"
        assert pod["spec"]["initContainers"][0]["name"] == SIDECAR_CONTAINER
        assert pod["spec"]["shareProcessNamespace"] is True
        # Three pods at once (1 driver + 2 workers) under a job-wide 1 core: 333m each.
        assert pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "333m"
    # The user's template is left as it was.
    assert "initContainers" not in tj["spec"]["jobSetTemplate"]["spec"]["replicatedJobs"][0][
        "template"]["spec"]["template"]["spec"]
    assert child.pods_at_once(tj["spec"]) == 3


def test_exactly_one_child_kind() -> None:
    both = jobset_tj()
    both["spec"]["jobTemplate"] = make_tj()["spec"]["jobTemplate"]
    neither = jobset_tj()
    del neither["spec"]["jobSetTemplate"]
    for tj in (both, neither):
        with pytest.raises(SpecError, match=r"exactly one of jobTemplate \(a Job\), "
                                            r"jobSetTemplate \(a JobSet\), workloadRef"):
            validate(tj, jobsets=True)


def test_a_reserved_name_in_any_replicated_job_is_refused() -> None:
    tj = jobset_tj()
    tj["spec"]["jobSetTemplate"]["spec"]["replicatedJobs"][1]["template"]["spec"]["template"][
        "spec"]["containers"][0]["name"] = SIDECAR_CONTAINER
    with pytest.raises(SpecError, match="is reserved"):
        validate(tj, jobsets=True)


def test_a_jobset_is_refused_where_the_operator_runs_without_jobset_support() -> None:
    """Without the chart's jobset.enabled the operator neither watches JobSets nor may
    make them (its RBAC): said at once, not as a refused create later."""
    with pytest.raises(SpecError, match=r"jobset\.enabled=true") as refused:
        validate(jobset_tj())
    assert refused.value.reason == "JobSetSupportOff"


def jobset(conditions: list[dict[str, Any]], active: int = 0) -> dict[str, Any]:
    return {"apiVersion": child.JOBSET_API, "kind": "JobSet",
            "metadata": {"name": "train", "uid": "js-1"}, "spec": {},
            "status": {"conditions": conditions, "replicatedJobsStatus": [
                {"name": "driver", "active": min(active, 1), "ready": 0},
                {"name": "worker", "active": max(0, active - 1), "ready": 0}]}}


@pytest.mark.parametrize(("conditions", "active", "phase"), [
    ([], 0, "Pending"),
    ([], 3, "Running"),
    ([{"type": "Completed", "status": "True", "lastTransitionTime": "2026-11-25T10:00:00Z",
       "message": "jobset completed successfully"}], 0, "Succeeded"),
    ([{"type": "Failed", "status": "True", "reason": "FailedJobs",
       "lastTransitionTime": "2026-11-25T10:00:00Z", "message": "jobset failed"}], 0,
     "Failed"),
    ([{"type": "StartupPolicyCompleted", "status": "True"}], 2, "Running"),
])
def test_a_jobsets_status_reads_as_a_jobs(conditions: list[dict[str, Any]], active: int,
                                          phase: str) -> None:
    status = status_from_job({}, child.as_job(jobset(conditions, active)), jobset_tj(),
                             "2026-11-25T10:00:01Z")
    assert status["phase"] == phase
    if phase == "Failed":
        (failed,) = [c for c in status["conditions"] if c["type"] == "Failed"]
        assert (failed["reason"], failed["message"]) == ("FailedJobs", "jobset failed")
    if phase == "Succeeded":
        assert status["completionTime"] == "2026-11-25T10:00:00Z"


def test_the_pods_of_a_jobset_are_known_by_its_uid_label() -> None:
    ours = {"metadata": {"labels": {child.JOBSET_UID_LABEL: "js-1"},
                         "ownerReferences": [{"kind": "Job", "uid": "job-7"}]}}
    theirs = {"metadata": {"labels": {child.JOBSET_UID_LABEL: "js-2"}}}
    job_pod = {"metadata": {"ownerReferences": [{"kind": "Job", "uid": "js-1"}]}}
    assert [child.pod_belongs(p, "js-1") for p in (ours, theirs, job_pod)] == [
        True, False, True]


def test_each_pod_of_a_jobset_has_its_own_templates_floor() -> None:
    """A driver that requests 300m and two workers of 200m take a job-wide 1 core: each
    pod needs its own template's requests (0.7 in all), not the sum of every template's
    (0.5 each, 1.5 in all, which refused it), and the split keeps each at its own."""
    tj = jobset_tj(scope="Job")
    driver, worker = (r["template"]["spec"]["template"]["spec"]["containers"][0]
                      for r in tj["spec"]["jobSetTemplate"]["spec"]["replicatedJobs"])
    driver["resources"] = {"requests": {"cpu": "300m"}}
    worker["resources"] = {"requests": {"cpu": "200m"}}
    validate(tj, jobsets=True)

    def pod(uid: str, group: str) -> dict[str, Any]:
        return {"metadata": {"name": uid, "uid": uid, "labels": {
                    child.JOBSET_REPLICATED_JOB_LABEL: group}},
                "status": {"phase": "Running"},
                "spec": {"containers": [{"name": group, "resources": {
                    "limits": {"cpu": "333m"}}}]}}

    ranks = job_ranks(tj["spec"], [pod("d", "driver"), pod("w0", "worker"),
                                   pod("w1", "worker")], {}, [])
    assert {r.uid: r.floor for r in ranks} == {"d": 0.3, "w0": 0.2, "w1": 0.2}
    tj["spec"]["throttle"]["targets"]["cpu"]["peak"] = "0.6"
    with pytest.raises(SpecError, match=r"under the 0.7 cores its 3 pods need at least "
                                        r"\(1 x 0.3, 2 x 0.2"):
        validate(tj, jobsets=True)
