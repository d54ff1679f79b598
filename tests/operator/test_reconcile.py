"""The reconcile pass's decision (reconcile.decide): from a made ThrottledJob and what the
API shows, the writes that bring its children to its spec; and none once they are there,
so that running the pass again, at any point, does nothing more. The writes' effect on a
real API server, with the operator killed and refused mid-way, is
tests/cluster/test_operator_specs_live.py's and tests/operator/test_faults.py's."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from testing.builders import built
from testing.manifests import make_tj
from throttledjob.operator.kueue import QUEUE_LABEL
from throttledjob.operator.reconcile import Seen, Writes, decide
from throttledjob.operator.validation import SpecError, validate


def made(**pod: Any) -> tuple[dict[str, Any], Seen]:
    """A ThrottledJob whose Job and ConfigMap are made and match its spec."""
    tj = make_tj("train", **pod)
    tj["metadata"].update(uid="uid-1", generation=1)
    job, cm = built(tj)
    tj["status"] = {"phase": "Running", "jobName": job["metadata"]["name"]}
    return tj, Seen(child=job, config_map=cm, workload=None)


def said(writes: Writes) -> dict[str, tuple[bool, str]]:
    return {s.type: (s.ok, s.reason) for s in writes.said}


def pass_over(tj: dict[str, Any], seen: Seen) -> Writes:
    try:
        policy: Any = validate(tj)
    except SpecError as e:
        policy = e
    return decide(tj, policy, seen)


def no_writes(writes: Writes) -> bool:
    return (writes.create_config_map is None and writes.config_map_data is None
            and writes.child_patch is None and writes.workload_patch is None
            and not writes.events and not writes.resize)


def test_children_that_match_the_spec_take_no_write_and_say_so() -> None:
    tj, seen = made()
    writes = pass_over(tj, seen)
    assert no_writes(writes)
    assert said(writes) == {"PolicyApplied": (True, "ConfigMapUpdated"),
                            "TemplateApplied": (True, "TemplateMatchesJob")}


def test_a_policy_edit_patches_the_configmap_once_and_resizes() -> None:
    tj, seen = made()
    tj["spec"]["throttle"]["targets"]["cpu"]["peak"] = "800m"
    writes = pass_over(tj, seen)
    assert "peak: 800m" in writes.config_map_data["policy.yaml"]
    assert writes.resize and [r for r, _ in writes.events] == ["PolicyUpdated"]
    assert writes.child_patch is None and writes.create_config_map is None
    # Run again once the patch is in: nothing more.
    cm = copy.deepcopy(seen.config_map)
    cm["data"] = writes.config_map_data
    assert no_writes(pass_over(tj, Seen(seen.child, cm, None)))


def test_a_refused_policy_edit_keeps_the_last_good_policy_and_warns() -> None:
    tj, seen = made()
    tj["spec"]["parameters"] = {"lr": {"type": "Number", "value": 5, "min": 0, "max": 1}}
    writes = pass_over(tj, seen)
    assert no_writes(writes)
    (refused,) = [s for s in writes.said if s.type == "PolicyApplied"]
    assert (refused.ok, refused.reason) == (False, "InvalidParameter")
    assert "above max" in refused.warning


def test_a_configmap_gone_while_the_job_runs_is_made_again() -> None:
    tj, seen = made()
    writes = pass_over(tj, Seen(seen.child, None, None))
    assert writes.create_config_map["metadata"]["name"] == seen.config_map["metadata"]["name"]
    assert writes.create_config_map["data"] == seen.config_map["data"]


@pytest.mark.parametrize(("edit", "reason"), [
    (lambda spec: spec["jobTemplate"]["spec"].update(backoffLimit=3), "JobTemplateImmutable"),
    (lambda spec: spec["throttle"].update(inject="Auto"), "InjectImmutable"),
])
def test_a_template_edit_cannot_reach_the_made_job_and_says_which(edit: Any,
                                                                   reason: str) -> None:
    tj, seen = made()
    edit(tj["spec"])
    writes = pass_over(tj, seen)
    assert no_writes(writes) and said(writes)["TemplateApplied"] == (False, reason)
    assert [s.warning for s in writes.said if s.type == "TemplateApplied"] != [None]


def test_suspend_goes_to_the_job_or_to_kueues_workload() -> None:
    tj, seen = made()
    tj["spec"]["suspend"] = True
    writes = pass_over(tj, seen)
    assert writes.child_patch == {"spec": {"suspend": True}}
    assert [r for r, _ in writes.events] == ["SuspendRequested"]
    job = copy.deepcopy(seen.child)
    job["spec"]["suspend"] = True
    assert no_writes(pass_over(tj, Seen(job, seen.config_map, None)))
    tj["spec"]["suspend"] = False
    assert pass_over(tj, Seen(job, seen.config_map, None)).child_patch == {
        "spec": {"suspend": False}}
    # Queued by Kueue: Kueue owns the Job's suspend; the Workload's spec.active is ours.
    queued = copy.deepcopy(seen.child)
    queued["metadata"].setdefault("labels", {})[QUEUE_LABEL] = "team"
    tj["spec"]["suspend"] = True
    workload = {"metadata": {"name": "w", "namespace": "ml"}, "spec": {"active": True}}
    writes = pass_over(tj, Seen(queued, seen.config_map, workload))
    assert writes.child_patch is None and writes.workload_patch == {"spec": {"active": False}}
    assert no_writes(pass_over(tj, Seen(queued, seen.config_map, None)))  # none made yet


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_throttledjob_is_left_as_it_ended(phase: str) -> None:
    tj, seen = made()
    tj["status"]["phase"] = phase
    tj["spec"]["suspend"] = True
    tj["spec"]["throttle"]["targets"]["cpu"]["peak"] = "800m"
    writes = pass_over(tj, seen)
    assert no_writes(writes) and not writes.said
    assert no_writes(pass_over(make_tj("train") | {"status": {"jobName": "x"}},
                               Seen(None, None, None)))
