"""The ThrottleBudget's pure parts: the budget in force (schedule, signal), its selector,
a member as the split sees it, a share as the member's policy, its status, its CRD."""

from __future__ import annotations

import datetime
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from throttledjob.contracts.policy import parse_policy
from throttledjob.operator import crd
from throttledjob.operator.budget_crd import BUDGET_CRD_FILE, build_budget_crd
from throttledjob.operator.budget_pass import (
    member,
    members_of,
    next_status,
    remember_suspended,
)
from throttledjob.operator.budget_spec import cores_now, selects
from throttledjob.operator.fleet import Fleet, held_policy
from throttledjob.operator.fleet_split import split
from throttledjob.operator.kube import ApiError
from throttledjob.operator.metrics import budget_metrics

ROOT = Path(__file__).resolve().parents[2]
UTC = datetime.timezone.utc


def at(hh: int, mm: int = 0) -> datetime.datetime:
    return datetime.datetime(2026, 12, 7, hh, mm, tzinfo=UTC)


SPEC = {"cpu": {"peak": "10"},
        "schedule": [{"start": "13:00", "end": "17:00", "fraction": 0.7},
                     {"start": "22:00", "end": "06:00", "fraction": 0.5}]}


def test_the_budget_in_force_is_the_lowest_window_or_signal_that_holds():
    assert cores_now(SPEC, at(12, 59)) == (10.0, "spec")
    assert cores_now(SPEC, at(13)) == (pytest.approx(7.0), "schedule 13:00-17:00 UTC")
    assert cores_now(SPEC, at(17)) == (10.0, "spec")
    assert cores_now(SPEC, at(3))[0] == pytest.approx(5.0)  # past midnight
    signal = {**SPEC, "signal": {"fraction": 0.65, "until": "2026-12-07T14:00:00Z"}}
    assert cores_now(signal, at(13, 30)) == (pytest.approx(6.5),
                                             "signal until 2026-12-07T14:00:00Z")
    assert cores_now(signal, at(14))[0] == pytest.approx(7.0)  # the signal has passed
    assert cores_now({"cpu": {"peak": "1500m"}, "signal": {"fraction": 0.5}}, at(9))[0] == 0.75


def test_the_selector_picks_as_kubernetes_does():
    assert selects(None, {"a": "b"}) and selects({}, None)
    assert selects({"matchLabels": {"team": "a"}}, {"team": "a", "x": "y"})
    assert not selects({"matchLabels": {"team": "a"}}, {"team": "b"})
    expr = {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["batch"]},
                                 {"key": "keep", "operator": "DoesNotExist"}]}
    assert selects(expr, {"tier": "batch"})
    assert not selects(expr, {"tier": "batch", "keep": "1"})
    assert not selects(expr, {"tier": "web"})


def tj(name: str, peak: str | None = "2", phase: str = "Running", scope: str = "Pod",
       labels: dict[str, str] | None = None, parallelism: int = 1) -> dict:
    throttle = {"maxSlowdown": 1.5, "scope": scope}
    if peak:
        throttle["targets"] = {"cpu": {"peak": peak}}
    return {"metadata": {"name": name, "namespace": "ns", "labels": labels or {}},
            "spec": {"jobTemplate": {"spec": {"parallelism": parallelism, "template": {
                "spec": {"containers": [{"name": "w", "resources": {
                    "requests": {"cpu": "100m"}}}]}}}},
                     "throttle": throttle},
            "status": {"phase": phase}}


def test_members_are_the_throttledjobs_the_selector_picks_that_run_or_are_about_to():
    budget = {"spec": {"selector": {"matchLabels": {"team": "a"}}}}
    new = tj("new", labels={"team": "a"})
    del new["status"]["phase"]  # its Job not made yet: it gets its share before
    tjs = [tj("b", labels={"team": "a"}), tj("a", labels={"team": "a"}, phase="Pending"),
           tj("done", phase="Succeeded", labels={"team": "a"}), tj("other"), new,
           tj("queued", phase="Queued", labels={"team": "a"})]
    assert [m["metadata"]["name"] for m in members_of(budget, tjs)] == ["a", "b", "new"]


def test_a_member_is_weighed_by_its_demand_once_read_whole_and_kept_before():
    fleet = Fleet()
    key = ("ns", "a")
    scope_pod = tj("a", peak="1", parallelism=3)
    m = member(scope_pod, fleet, "fleet", {"a": 1.2})
    assert m.cap == 3.0 and m.floor == pytest.approx(0.3) and m.held == 1.2 and m.demand == ()
    reports = {"u1": {"cpuDemandCores": {"w": 1.5}, "observed": {"cpuCores": 1.0}}}
    for _ in range(3):
        fleet.record(key, reports, 0.1, answered=True)
    m = member(scope_pod, fleet, "fleet", {"a": 1.2})
    assert m.held is None and m.demand == (1.5, 1.5, 1.5)
    assert m.cap == 1.0  # one pod read: the per-pod target once
    fleet.record(key, reports, 0.1, answered=False)  # a sidecar did not answer
    assert member(scope_pod, fleet, "fleet", {"a": 1.2}).held == 1.2
    starting = tj("b", phase="Pending")  # no pods running: split anew, not held
    assert member(starting, Fleet(), "fleet", {"b": 1.2}).held is None


def test_a_members_demand_is_every_second_its_pods_histories_cover_each_once():
    """cpuDemandHistory merged: each whole second, every pod's latest sample summed; a
    second kept is not kept again at the next read; a pod without history (an older
    sidecar) makes the read count one sample, its use."""
    fleet, key = Fleet(), ("ns", "a")
    a = [[100.2, 1.0], [101.2, 2.0], [102.2, 0.0], [103.2, 2.0]]
    b = [[100.7, 0.5], [101.7, 0.5], [102.7, 1.5]]
    fleet.record(key, {"a": {"cpuDemandHistory": a}, "b": {"cpuDemandHistory": b}}, 0.1, True)
    # Seconds 101 and 102 are covered by both (b's history ends at 102.7).
    assert list(fleet.demand[key]) == [1.0 + 0.5, 2.0 + 0.5]
    fleet.record(key, {"a": {"cpuDemandHistory": [*a, [104.2, 1.0]]},
                       "b": {"cpuDemandHistory": [*b, [103.7, 0.0]]}}, 0.1, True)
    # Second 103: a's latest sample by then is 102.2's, b's 102.7's.
    assert list(fleet.demand[key]) == [1.5, 2.5, 0.0 + 1.5]
    fleet.record(key, {"a": {"cpuDemandHistory": a}, "b": {"cpuDemandCores": {"w": 3.0}}},
                 0.1, True)
    assert list(fleet.demand[key])[-1] == 3.0 + 0.0  # a's cpuDemandCores: none, so 0
    assert fleet.reads[key] == 3


def test_members_made_one_after_the_other_share_the_budget_before_their_pods_start():
    fleet = Fleet()
    first = tj("first")
    del first["status"]["phase"]
    out = split(1.0, [member(first, fleet, "b", {})])
    fleet.set_share(("ns", "first"), "b", out.of("first").cores)
    second = tj("second")
    del second["status"]["phase"]
    first["status"]["phase"] = "Pending"
    out = split(1.0, [member(first, fleet, "b", {}), member(second, fleet, "b", {})])
    assert [s.cores for s in out.shares] == [pytest.approx(0.5), pytest.approx(0.5)]


def test_a_share_is_the_members_policy_held_hard_and_never_past_its_own_target():
    doc = {"targets": {"cpu": {"peak": "2"}}, "maxSlowdown": 1.5}
    scope_pod = tj("a", peak="2")["spec"]
    held = held_policy(doc, scope_pod, 3.0, pods=2)  # 1.5 each
    assert held["targets"] == {"cpu": {"peak": "1500m"}, "hold": "Hard"}
    assert parse_policy(held).cpu_peak_cores == 1.5
    assert held_policy(doc, scope_pod, 9.0, pods=1)["targets"]["cpu"]["peak"] == "2000m"
    job_wide = tj("a", peak="4", scope="Job")["spec"]
    assert held_policy({"targets": {"cpu": {"peak": "4"}}}, job_wide, 2.5, pods=4)[
        "targets"]["cpu"]["peak"] == "2500m"
    assert doc == {"targets": {"cpu": {"peak": "2"}}, "maxSlowdown": 1.5}  # not changed


def test_two_budgets_over_one_member_the_lower_holds_and_the_other_says_so():
    fleet = Fleet()
    fleet.set_share(("ns", "a"), "team", 1.0)
    fleet.set_share(("ns", "a"), "hall", 0.6)
    assert fleet.share(("ns", "a")) == (0.6, "hall")
    budget = {"metadata": {"name": "team", "generation": 1}, "spec": {}}
    m = member(tj("a"), fleet, "team", {})
    out = split(1.0, [m])
    status = next_status(budget, [m], out, 1.0, "spec", fleet, "ns", "now")
    assert status["members"][0]["heldBy"] == "hall"
    fleet.set_share(("ns", "a"), "hall", None)
    assert fleet.share(("ns", "a")) == (1.0, "team")


def test_floors_over_the_budget_are_named_in_its_condition():
    fleet = Fleet()
    members = [member(tj(n, parallelism=4), fleet, "b", {}) for n in ("a", "b")]
    out = split(0.5, members)
    status = next_status({"metadata": {"name": "b", "generation": 2}}, members, out, 0.5,
                         "spec", fleet, "ns", "2026-12-07T00:00:00Z")
    (met,) = status["conditions"]
    assert (met["type"], met["status"], met["reason"]) == ("BudgetMet", "False",
                                                           "FloorOverBudget")
    assert "0.8 cores, over the 0.5-core budget" in met["message"]
    assert status["observedGeneration"] == 2
    assert [r["read"] for r in status["members"]] == [False, False]  # not measured yet


def test_suspended_members_are_listed_and_named_in_the_condition():
    fleet = Fleet()
    members = [member(tj("a"), fleet, "b", {})]
    status = next_status({"metadata": {"name": "b", "generation": 1}}, members,
                         split(0.5, members), 0.5, "spec", fleet, "ns",
                         "2026-12-07T00:00:00Z", ["c", "d"])
    (met,) = status["conditions"]
    assert (met["status"], met["reason"]) == ("True", "MembersSuspended")
    assert met["message"].endswith("0.5-core budget: c, d")
    assert status["suspended"] == ["c", "d"]


def test_after_a_restart_the_members_a_budget_suspended_stay_so_until_it_decides():
    """At the operator's start, each budget's status.suspended goes on record (another
    budget's suspension already there is kept); a list refused is logged, not fatal."""

    class Kube:
        def __init__(self) -> None:
            self.paths: list[str] = []

        def list(self, path: str, selector: str) -> list[dict]:
            self.paths.append(path)
            if "/namespaces/gone/" in path:
                raise ApiError(403, "forbidden")
            return [{"metadata": {"namespace": "ns", "name": "b"},
                     "status": {"suspended": ["a", "c"]}},
                    {"metadata": {"namespace": "ns", "name": "new"}}]

    state = SimpleNamespace(kube=Kube(), fleet=Fleet())
    state.fleet.set_suspended(("ns", "c"), "other")
    remember_suspended(state, ["gone", "ns"], logging.getLogger("test"))
    assert state.fleet.suspended == {("ns", "a"): "b", ("ns", "c"): "other"}
    assert state.kube.paths[-1].endswith("/namespaces/ns/throttlebudgets")
    remember_suspended(state, [], logging.getLogger("test"))  # cluster-wide
    assert state.kube.paths[-1] == "/apis/throttledjob.io/v1alpha1/throttlebudgets"


def test_a_members_priority_is_its_label_else_its_kueue_workloads():
    fleet = Fleet()
    fleet.priorities[("ns", "a")] = 100  # from its WorkloadPriorityClass
    assert member(tj("a"), fleet, "b", {}).priority == 100
    labelled = tj("a", labels={"throttledjob.io/priority": "7"})
    assert member(labelled, fleet, "b", {}).priority == 7
    assert member(tj("c"), fleet, "b", {}).priority == 0


def test_the_budget_crd_file_is_generated_from_the_source():
    path = ROOT / BUDGET_CRD_FILE
    assert path.read_text() == crd.render_yaml(build_budget_crd()), (
        "run: python -m throttledjob.operator.crd --write")
    assert yaml.safe_load(path.read_text())["spec"]["names"]["kind"] == "ThrottleBudget"


def test_the_fleets_metrics_are_each_budget_and_each_members_share():
    fleet = Fleet()
    fleet.set_budget(("ns", "team"), 6.0, 5.5)
    fleet.set_share(("ns", "a"), "team", 4.0)
    fleet.set_share(("ns", "b"), "team", 2.0)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in budget_metrics(fleet) for s in family.samples}
    assert samples == {
        ("throttledjob_operator_budget_cpu_cores", (("budget", "team"), ("namespace", "ns"))): 6.0,
        ("throttledjob_operator_budget_cpu_use_cores",
         (("budget", "team"), ("namespace", "ns"))): 5.5,
        ("throttledjob_operator_budget_share_cpu_cores",
         (("budget", "team"), ("namespace", "ns"), ("throttledjob", "a"))): 4.0,
        ("throttledjob_operator_budget_share_cpu_cores",
         (("budget", "team"), ("namespace", "ns"), ("throttledjob", "b"))): 2.0}
    fleet.set_budget(("ns", "team"), None)
    assert not [s for family in budget_metrics(fleet) for s in family.samples
                if s.name == "throttledjob_operator_budget_cpu_cores"]
