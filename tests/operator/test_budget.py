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
    Weighed,
    gpu_member,
    member,
    members_of,
    next_status,
    remember_suspended,
)
from throttledjob.operator.budget_spec import cores_now, selects, watts_now
from throttledjob.operator.fleet import CPU, GPU, Fleet, held_policy, held_power, template_gpus
from throttledjob.operator.fleet_split import Member, split
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
    status = next_status(budget, [Weighed(CPU, 1.0, [m], out)], "spec", fleet, "ns", "now")
    assert status["members"][0]["heldBy"] == "hall"
    fleet.set_share(("ns", "a"), "hall", None)
    assert fleet.share(("ns", "a")) == (1.0, "team")


def test_floors_over_the_budget_are_named_in_its_condition():
    fleet = Fleet()
    members = [member(tj(n, parallelism=4), fleet, "b", {}) for n in ("a", "b")]
    out = split(0.5, members)
    status = next_status({"metadata": {"name": "b", "generation": 2}},
                         [Weighed(CPU, 0.5, members, out)], "spec", fleet, "ns",
                         "2026-12-07T00:00:00Z")
    (met,) = status["conditions"]
    assert (met["type"], met["status"], met["reason"]) == ("BudgetMet", "False",
                                                           "FloorOverBudget")
    assert "0.8 cores, over the budget of 0.5 cores" in met["message"]
    assert status["observedGeneration"] == 2
    assert [r["read"] for r in status["members"]] == [False, False]  # not measured yet


def test_suspended_members_are_listed_and_named_in_the_condition():
    fleet = Fleet()
    members = [member(tj("a"), fleet, "b", {})]
    status = next_status({"metadata": {"name": "b", "generation": 1}},
                         [Weighed(CPU, 0.5, members, split(0.5, members))], "spec", fleet,
                         "ns", "2026-12-07T00:00:00Z", ["c", "d"])
    (met,) = status["conditions"]
    assert (met["status"], met["reason"]) == ("True", "MembersSuspended")
    assert met["message"].endswith("budget of 0.5 cores: c, d")
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
    fleet.set_budget(("ns", "team"), {"cpuBudgetCores": 6.0, "cpuCores": 5.5,
                                      "splitTime": "now"})
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


def gpu_tj(name: str, gpus: int = 1, watts: float | None = None, phase: str = "Running") -> dict:
    out = tj(name, peak=None, phase=phase)
    (c,) = out["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    c["resources"]["limits"] = {"nvidia.com/gpu": str(gpus)}
    if watts is not None:
        out["spec"]["throttle"]["targets"] = {"gpu": {"peakPowerWatts": watts}}
    return out


def gpu_report(t0: float, watts: list[float], boards: int = 1) -> dict:
    """A pod's /status with `boards` GPUs of the simulated board's range and its GPUs'
    demand one sample a second from `t0`."""
    return {"observed": {"cpuCores": 0.1},
            "gpuDemandHistory": [[t0 + i, w] for i, w in enumerate(watts)],
            "telemetry": {"gpus": [{"gpu": i, "UUID": f"GPU-{i}", "minLimitWatts": 100.0,
                                    "maxLimitWatts": 300.0} for i in range(boards)]}}


def test_a_gpu_members_demand_floor_and_target_are_its_boards():
    """What a GPU-watt split weighs: the pods' gpuDemandHistory merged as the CPU's, the
    boards' lowest limits summed as its floor, its own power target times its GPUs as its
    cap; before a read, its GPUs from its template; no GPUs: no member of the split."""
    fleet, key = Fleet(), ("ns", "g")
    member_tj = gpu_tj("g", gpus=2, watts=250.0)
    before = gpu_member(member_tj, fleet, "hall", {"g": 400.0})
    assert (before.floor, before.cap, before.held, before.demand) == (0.0, 500.0, 400.0, ())
    assert gpu_member(tj("cpu-only"), fleet, "hall", {}) is None
    for i in range(3):
        fleet.record(key, {"a": gpu_report(100.2 + 3 * i, [280.0, 290.0, 150.0]),
                           "b": gpu_report(100.7 + 3 * i, [200.0, 200.0, 200.0])}, 0.1, True)
    m = gpu_member(member_tj, fleet, "hall", {"g": 400.0})
    assert m.held is None and m.floor == 200.0 and fleet.gpus[key] == 2
    assert list(m.demand)[:2] == [280.0 + 200.0, 290.0 + 200.0]
    assert template_gpus(gpu_tj("x", gpus=4)["spec"]) == 4


def test_a_gpu_watt_budget_gives_the_bursty_member_less_and_holds_each_gpu_to_its_part():
    """Two members of one GPU each under 400 W: one draws 288 W every second, the other
    idles at 60 W with a burst to 288 W one second in ten. The steady one gets more (a
    cap costs it every second), the shares fit the budget, each is over its floor, and a
    share becomes each GPU's power target, held Hard, never past the member's own."""
    steady = Member("steady", (288.0,) * 60, 100.0)
    bursty = Member("bursty", tuple(288.0 if i % 10 == 0 else 60.0 for i in range(60)), 100.0)
    out = split(400.0, [steady, bursty])
    assert out.of("steady").cores > out.of("bursty").cores >= 100.0
    assert out.total <= 400.0 + 1e-6
    assert out.of("steady").slowdown + out.of("bursty").slowdown < 2 * Member(
        "even", (288.0,) * 60, 100.0).slowdown(200.0)
    doc = {"targets": {"gpu": {"peakPowerWatts": 250}}, "maxSlowdown": 2.0}
    assert held_power(doc, 401.0, gpus=2)["targets"] == {"gpu": {"peakPowerWatts": 200},
                                                          "hold": "Hard"}
    assert held_power(doc, 900.0, gpus=2)["targets"]["gpu"]["peakPowerWatts"] == 250
    assert parse_policy(held_power({}, 150.0, gpus=1)).gpu_peak_power_watts == 150.0
    fleet = Fleet()
    fleet.set_share(("ns", "g"), "hall", 300.0, GPU)
    fleet.set_share(("ns", "g"), "team", 1.5)
    held = fleet.held(("ns", "g"), {"maxSlowdown": 2.0}, gpu_tj("g", gpus=2)["spec"])
    assert held["targets"] == {"cpu": {"peak": "1500m"}, "gpu": {"peakPowerWatts": 150},
                               "hold": "Hard"}


def test_a_budget_of_both_shows_each_resource_and_one_row_a_member():
    fleet = Fleet()
    cpu = [member(tj("a"), fleet, "b", {}), member(tj("c"), fleet, "b", {})]
    gpu = [Member("a", (250.0,) * 10, 100.0, max_slowdown=1.5), Member("g", (), 100.0)]
    status = next_status({"metadata": {"name": "b", "generation": 1}},
                         [Weighed(CPU, 1.0, cpu, split(1.0, cpu)),
                          Weighed(GPU, 300.0, gpu, split(300.0, gpu))],
                         "spec", fleet, "ns", "2026-12-07T00:00:00Z")
    rows = {r["name"]: r for r in status["members"]}
    assert set(rows) == {"a", "c", "g"}
    assert "shareWatts" in rows["a"] and "shareCores" in rows["a"]
    assert "shareWatts" not in rows["c"] and "shareCores" not in rows["g"]
    assert rows["a"]["shareWatts"] + rows["g"]["shareWatts"] <= 300
    assert rows["a"]["demandWatts"] == 250.0 and not rows["g"]["read"]
    assert (status["gpuBudgetWatts"], status["gpuFloorWatts"], status["gpuDemandWatts"]) == (
        300.0, 200.0, 250.0)
    (met,) = status["conditions"]
    assert met["message"].startswith("3 member(s) held to 1 cores and 300 W of GPU power")
    over = next_status({"metadata": {"name": "b", "generation": 1}},
                       [Weighed(GPU, 150.0, gpu, split(150.0, gpu))], "spec", fleet, "ns",
                       "2026-12-07T00:00:00Z")
    assert "cpuBudgetCores" not in over
    assert "floors come to 200 W of GPU power, over the budget of 150 W" in over[
        "conditions"][0]["message"]


def test_the_gpu_watt_budget_follows_the_schedule_and_its_metrics_show_it():
    spec = {**SPEC, "gpu": {"peakWatts": 40000}}
    assert watts_now(spec, at(14)) == pytest.approx(28000.0)
    assert watts_now(SPEC, at(14)) is None
    fleet = Fleet()
    fleet.set_budget(("ns", "hall"), {"gpuBudgetWatts": 28000.0, "gpuDemandWatts": 31000.0})
    fleet.set_share(("ns", "a"), "hall", 700.0, GPU)
    samples = {(s.name, s.labels.get("throttledjob")): s.value
               for family in budget_metrics(fleet) for s in family.samples}
    assert samples == {("throttledjob_operator_budget_gpu_watts", None): 28000.0,
                       ("throttledjob_operator_budget_gpu_demand_watts", None): 31000.0,
                       ("throttledjob_operator_budget_share_gpu_watts", "a"): 700.0}


def test_a_resource_edited_out_of_a_budget_frees_its_members_of_it():
    """A budget of both edited to GPU only: its CPU shares go (the members back to their
    own CPU targets), its CPU figures leave its status, its GPU split stays."""
    from throttledjob.operator.budget_pass import budget_pass
    from throttledjob.operator.config import OperatorSettings
    from throttledjob.operator.sidecar_status import HttpStatusReader
    from throttledjob.operator.state import OperatorState

    class Kube:
        def __init__(self, budget: dict, tjs: list[dict]) -> None:
            self.budget, self.tjs, self.patches = budget, tjs, []

        def get(self, path: str) -> dict | None:
            return self.budget if "/throttlebudgets/" in path else None  # rebudget: gone

        def list(self, path: str, selector: str) -> list[dict]:
            return self.tjs

        def merge_patch(self, path: str, patch: dict) -> None:
            self.patches.append(patch)
            self.budget["status"] = patch["status"]

        tj_path = staticmethod(lambda namespace, name: f"/tjs/{namespace}/{name}")

    both = {"metadata": {"name": "hall", "namespace": "ns", "generation": 1},
            "spec": {"cpu": {"peak": "1"}, "gpu": {"peakWatts": 300}}}
    kube = Kube(both, [gpu_tj("g", gpus=1)])
    state = OperatorState(OperatorSettings(), kube, HttpStatusReader(1))  # type: ignore[arg-type]
    budget_pass(state, "ns", "hall")
    assert state.fleet.share(("ns", "g")) == (1.0, "hall")
    assert state.fleet.share(("ns", "g"), GPU) == (300.0, "hall")
    assert kube.budget["status"]["cpuBudgetCores"] == 1.0
    del both["spec"]["cpu"]
    budget_pass(state, "ns", "hall")
    assert state.fleet.share(("ns", "g")) is None
    assert state.fleet.share(("ns", "g"), GPU) == (300.0, "hall")
    assert "cpuBudgetCores" not in kube.budget["status"]
    assert kube.budget["status"]["members"] == [
        {"name": "g", "slowdown": 1.0, "withinMaxSlowdown": True, "read": False,
         "priority": 0, "shareWatts": 300, "maxSlowdown": 1.5}]
