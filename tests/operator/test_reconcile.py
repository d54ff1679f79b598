"""The reconcile pass's decision (writes.decide): from a made ThrottledJob and what the
API shows, the writes that bring its children to its spec; and none once they are there,
so that running the pass again, at any point, does nothing more. The writes' effect on a
real API server, with the operator killed and refused mid-way, is
tests/cluster/test_operator_specs_live.py's and tests/operator/test_faults.py's."""

from __future__ import annotations

import ast
import copy
from typing import Any

import pytest

from testing.builders import built
from testing.manifests import make_tj
from testing.paths import ROOT
from throttledjob.operator.kueue import QUEUE_LABEL, queued_by_kueue
from throttledjob.operator.observe import Found, Seen
from throttledjob.operator.validation import SpecError, validate
from throttledjob.operator.writes import Writes, decide, events_after, next_status

OPERATOR = ROOT / "src" / "throttledjob" / "operator"


def made(**pod: Any) -> tuple[dict[str, Any], Seen]:
    """A ThrottledJob whose Job and ConfigMap are made and match its spec."""
    tj = make_tj("train", **pod)
    tj["metadata"].update(uid="uid-1", generation=1)
    job, cm = built(tj)
    tj["status"] = {"phase": "Running", "jobName": job["metadata"]["name"]}
    return tj, looked(job, cm)


def looked(job: dict[str, Any] | None, cm: dict[str, Any] | None,
           workload: dict[str, Any] | None = None) -> Seen:
    """What a pass for the spec sees: the child, its ConfigMap and, where Kueue queues
    the child, its Workload (observe.spec_seen)."""
    return Seen(for_spec=True,
                child=Found(job, job["metadata"]["name"] if job else "train-x"),
                config_map=Found(cm),
                workload=Found(workload) if job and queued_by_kueue(job) else None)

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
    assert writes.resize and [e.reason for e in writes.events] == ["PolicyUpdated"]
    assert writes.child_patch is None and writes.create_config_map is None
    # Run again once the patch is in: nothing more.
    cm = copy.deepcopy(seen.config_map.obj)
    cm["data"] = writes.config_map_data
    assert no_writes(pass_over(tj, looked(seen.child.obj, cm)))


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
    writes = pass_over(tj, looked(seen.child.obj, None))
    assert writes.create_config_map["metadata"]["name"] == seen.config_map.obj["metadata"]["name"]
    assert writes.create_config_map["data"] == seen.config_map.obj["data"]


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
    assert [e.reason for e in writes.events] == ["SuspendRequested"]
    job = copy.deepcopy(seen.child.obj)
    job["spec"]["suspend"] = True
    assert no_writes(pass_over(tj, looked(job, seen.config_map.obj)))
    tj["spec"]["suspend"] = False
    assert pass_over(tj, looked(job, seen.config_map.obj)).child_patch == {
        "spec": {"suspend": False}}
    # Queued by Kueue: Kueue owns the Job's suspend; the Workload's spec.active is ours.
    queued = copy.deepcopy(seen.child.obj)
    queued["metadata"].setdefault("labels", {})[QUEUE_LABEL] = "team"
    tj["spec"]["suspend"] = True
    workload = {"metadata": {"name": "w", "namespace": "ml"}, "spec": {"active": True}}
    writes = pass_over(tj, looked(queued, seen.config_map.obj, workload))
    assert writes.child_patch is None and writes.workload_patch == {"spec": {"active": False}}
    assert no_writes(pass_over(tj, looked(queued, seen.config_map.obj)))  # none made yet


def test_a_budget_suspends_a_queued_member_through_its_workload_and_says_which() -> None:
    """fleet_split.to_suspend chose it: its Workload deactivated as for spec.suspend,
    the event naming the budget; once the budget lets it go, it is resumed."""
    tj, seen = made()
    queued = copy.deepcopy(seen.child.obj)
    queued["metadata"].setdefault("labels", {})[QUEUE_LABEL] = "team"
    workload = {"metadata": {"name": "w", "namespace": "ml"}, "spec": {"active": True}}
    seen = looked(queued, seen.config_map.obj, workload)
    writes = decide(tj, validate(tj), seen, suspended_by="team-a")
    assert writes.workload_patch == {"spec": {"active": False}}
    (event,) = writes.events
    assert event.reason == "SuspendRequested" and "ThrottleBudget team-a" in event.message
    workload["spec"]["active"] = False
    writes = decide(tj, validate(tj), seen)
    assert writes.workload_patch == {"spec": {"active": True}}
    assert [e.message.endswith("resumed") for e in writes.events] == [True]


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_throttledjob_is_left_as_it_ended(phase: str) -> None:
    tj, seen = made()
    tj["status"]["phase"] = phase
    tj["spec"]["suspend"] = True
    tj["spec"]["throttle"]["targets"]["cpu"]["peak"] = "800m"
    writes = pass_over(tj, seen)
    assert no_writes(writes) and not writes.said
    assert no_writes(pass_over(make_tj("train") | {"status": {"jobName": "x"}},
                               looked(None, None)))


def written(tj: dict[str, Any], seen: Seen) -> tuple[dict[str, Any], list[Any]]:
    """A pass's status write and its events, as reconcile.apply makes them."""
    writes = pass_over(tj, seen)
    old = tj.get("status") or {}
    new = next_status(dict(old), tj, seen, writes, "2026-12-07T12:00:00Z")
    return new, events_after(old, new, writes, "Job")


def test_the_child_watch_moves_the_phase_once_with_one_event() -> None:
    """The Job's controller marks it Complete: the pass from its watch (which looked at
    nothing else) moves the phase and says so once; the same event again writes the
    same status and says nothing."""
    tj, seen = made()
    job = copy.deepcopy(seen.child.obj)
    job["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    child_only = Seen(child=Found(job, job["metadata"]["name"]))
    new, events = written(tj, child_only)
    assert new["phase"] == "Succeeded"
    assert [(e.reason, e.warning) for e in events] == [("JobSucceeded", False)]
    assert "observedGeneration" not in new  # not a pass for the spec
    tj["status"] = new
    assert written(tj, child_only) == (new, [])


def test_a_child_deleted_before_it_finished_fails_the_throttledjob_with_a_warning() -> None:
    tj, seen = made()
    new, events = written(tj, Seen(child=Found(seen.child.obj, seen.child.name),
                                   deleted=True))
    assert (new["phase"], [(e.reason, e.warning) for e in events]) == (
        "Failed", [("JobDeleted", True)])
    # Another child of that name (its predecessor's) deleted: not this ThrottledJob's.
    other = Seen(child=Found(None, "train-old"), deleted=True)
    assert written(tj, other)[0]["phase"] == "Running"


def test_a_queue_tick_holds_a_workload_made_anew_and_says_why_it_waits() -> None:
    """Kueue made the Workload anew, active, while spec.suspend holds the Job: the queue
    tick's pass (the child and its Workload, nothing else) deactivates it and writes
    Kueue's reason into Admitted."""
    tj, seen = made()
    job = copy.deepcopy(seen.child.obj)
    job["metadata"].setdefault("labels", {})[QUEUE_LABEL] = "team"
    job["spec"]["suspend"] = True
    tj["spec"]["suspend"] = True
    workload = {"metadata": {"name": "w", "namespace": "ml"}, "spec": {"active": True},
                "status": {"conditions": [{"type": "QuotaReserved", "status": "False",
                                           "reason": "Pending", "message": "no quota"}]}}
    seen = Seen(child=Found(job, job["metadata"]["name"]), workload=Found(workload))
    writes = pass_over(tj, seen)
    assert writes.workload_patch == {"spec": {"active": False}} and writes.said == []
    new, _ = written(tj, seen)
    assert new["phase"] == "Suspended"
    admitted = next(c for c in new["conditions"] if c["type"] == "Admitted")
    assert admitted["status"] == "False"


def test_only_a_reconcile_pass_writes() -> None:
    """The one path: of the operator's modules, only the pass (reconcile.py), its first
    step (create.py, until the child is made) and the pods' limits it calls
    (pod_limits.py) write to the API or post events; and those two are called from the
    pass alone."""
    writes = {"update_status", "merge_patch", "create", "resize_pod", "delete", "warn",
              "event", "normal"}
    edges = ("kube.py", "events.py")  # the API client, the Normal event helper
    writers, callers = set(), {"ensure_children": set(), "reconcile": set()}
    for path in sorted(OPERATOR.glob("*.py")):
        if path.name in edges:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") in callers:
                    callers[node.func.id].add(path.name)
                continue
            on = node.func.value
            if node.func.attr in writes and not (isinstance(on, ast.Attribute)
                                                 and on.attr == "on"):  # kopf.on.create
                writers.add(path.name)
            if node.func.attr == "reconcile" and isinstance(on, ast.Attribute) \
                    and on.attr == "limits":
                callers["reconcile"].add(path.name)
    # webhook_certs.py writes the admission webhook's own Secret and CA, no ThrottledJob's;
    # budget_pass.py its ThrottleBudget's status (a member's share reaches the member
    # through a pass of reconcile.py: rebudget).
    assert writers == {"reconcile.py", "create.py", "pod_limits.py", "webhook_certs.py",
                       "budget_pass.py"}
    assert callers == {"ensure_children": {"reconcile.py"}, "reconcile": {"reconcile.py"}}
