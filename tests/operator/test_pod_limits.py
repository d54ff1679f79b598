"""The one writer of the pods' CPU limits: what each pod should have (`plan`, pure), from
the spec and what the sidecars last said."""

from __future__ import annotations

from typing import Any

import pytest

from throttledjob.operator import events as operator_events
from throttledjob.operator import pod_limits
from throttledjob.operator.observe import Seen
from throttledjob.operator.pod_limits import PodLimits
from throttledjob.operator.validation import policy_document
from throttledjob.operator.writes import cpu_target, decide


def target_of(tj: dict[str, Any]) -> float | None:
    return cpu_target(tj["spec"], policy_document(tj["spec"]))


def plan(tj: dict[str, Any], pods: list[dict[str, Any]], reports: Any,
         refused: dict[str, float]) -> tuple[list[Any], list[Any]]:
    """pod_limits.plan at the target a reconcile pass parses from the spec."""
    return pod_limits.plan(tj, pods, reports, refused, target_of(tj))


def tj(peak: str, scope: str = "Pod") -> dict[str, Any]:
    return {"metadata": {"name": "train", "namespace": "ml"}, "spec": {
        "jobTemplate": {"spec": {"parallelism": 2, "template": {"spec": {"containers": [
            {"name": "work", "image": "train:1"}]}}}},
        "throttle": {"targets": {"cpu": {"peak": peak}}, "enforcement": "Quota",
                     "scope": scope, "maxSlowdown": 1.25}}}


def pod(uid: str, limit: str) -> dict[str, Any]:
    return {"metadata": {"name": f"train-{uid}", "namespace": "ml", "uid": uid},
            "status": {"phase": "Running"},
            "spec": {"containers": [{"name": "work", "resources": {
                "requests": {"cpu": limit}, "limits": {"cpu": limit}}}]}}


def totals(resizes: list[Any]) -> dict[str, float]:
    return {r.pod["metadata"]["uid"]: r.total for r in resizes}


def test_a_read_lifts_what_its_sidecar_asks_and_leaves_a_silent_pod_alone() -> None:
    """Pod a is lifted (its sidecar asks for 1.6); pod b was lifted, but its sidecar did
    not answer this read: it keeps its limits (a slow answer must not resize it back and
    forth). A live edit reads no sidecar: every pod goes to the new target."""
    pods = [pod("a", "1000m"), pod("b", "1600m")]
    resizes, _ = plan(tj("1"), pods, {"a": {"cpuLimitWantedCores": 1.6}}, {})
    assert totals(resizes) == {"a": 1.6}
    assert [r.total > r.target for r in resizes] == [True]
    resizes, _ = plan(tj("0.8"), pods, None, {})
    assert totals(resizes) == {"a": 0.8, "b": 0.8}


def test_a_new_target_a_little_over_the_limits_is_applied() -> None:
    """A live edit from 1 to 1.05 cores: under the 10% that a change of the split among
    containers must pass, but the pod's total moves, so it is resized."""
    resizes, _ = plan(tj("1.05"), [pod("a", "1000m")], None, {})
    assert [(r.total, r.tolerance) for r in resizes] == [(1.05, 0.0)]


def test_a_refused_total_is_not_planned_again_and_signals_plan_nothing() -> None:
    pods = [pod("a", "1000m")]
    assert plan(tj("1"), pods, {"a": {"cpuLimitWantedCores": 3.0}}, {"a": 3.0})[0] == []
    signals = tj("1")
    signals["spec"]["throttle"]["enforcement"] = "Signals"
    assert plan(signals, pods, {"a": {"cpuLimitWantedCores": 1.6}}, {}) == ([], [])


def test_under_scope_job_a_pod_not_read_keeps_its_limit() -> None:
    """Job-wide 1 core over two pods: b's sidecar is silent, so it keeps its 0.5 and a,
    however much it wants, gets only what is left."""
    pods = [pod("a", "500m"), pod("b", "500m")]
    report = {"observed": {"cpuCores": 0.9, "stepsPerSecond": 1.0}}
    resizes, ranks = plan(tj("1", "Job"), pods, {"a": report}, {})
    assert totals(resizes) == {} and [r.uid for r in ranks] == ["a", "b"]
    resizes, _ = plan(tj("1", "Job"), [pod("a", "300m"), pod("b", "500m")], {"a": report}, {})
    assert totals(resizes) == {"a": 0.5}


class Resizes:
    """The API's `pods/resize`, recorded."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def resize_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(name)
        return {}


def test_a_pod_being_deleted_keeps_its_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A live edit of the target moves every pod but one being deleted: through its grace
    period it may save a checkpoint, which a cut would slow (its sidecar has stood down
    and asks for no lift, which read as a move back to the target)."""
    monkeypatch.setattr(operator_events, "normal", lambda *a, **k: None)
    leaving = pod("a", "1000m")
    leaving["metadata"]["deletionTimestamp"] = "2026-11-28T10:00:00Z"
    api = Resizes()
    PodLimits(api).reconcile(tj("0.5"), [leaving, pod("b", "1000m")], None,  # type: ignore[arg-type]
                             target_of(tj("0.5")))
    assert api.calls == ["train-b"]


def test_a_hard_target_is_never_lifted_whatever_a_sidecar_asks() -> None:
    """Hold Hard (and a ThrottleBudget's share, held Hard): a sidecar that has not yet read
    the new policy may still ask for a lift; the pass does not make it (decide's `lift`)."""
    pods = [pod("a", "1000m")]
    asks = {"a": {"cpuLimitWantedCores": 1.6}}
    assert totals(pod_limits.plan(tj("1"), pods, asks, {}, 1.0, lift=False)[0]) == {"a": 1.0}
    assert totals(pod_limits.plan(tj("1"), pods, asks, {}, 1.0)[0]) == {"a": 1.6}
    hard = tj("1")
    hard["spec"]["throttle"]["targets"]["hold"] = "Hard"
    assert not decide(hard, policy_document(hard["spec"]), Seen()).lift
    assert decide(tj("1"), policy_document(tj("1")["spec"]), Seen()).lift
