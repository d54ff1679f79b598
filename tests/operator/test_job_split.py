"""A job-wide CPU target split among the Job's pods (scope Job): the parts by each rank's
cost of a step, the order of the resizes that keeps the sum of the limits in force under
the target, and what the operator does with them (the poller, its API calls recorded)."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import random
import threading
import time
from typing import Any

import kopf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testing.fake_sidecar import FakeSidecar
from testing.manifests import make_tj
from throttledjob.operator import events as operator_events
from throttledjob.operator import job_split
from throttledjob.operator.api_names import SIDECAR_CONTAINER
from throttledjob.operator.children import build_child
from throttledjob.operator.config import OperatorSettings
from throttledjob.operator.job_split import Rank, moves, ranks, shares
from throttledjob.operator.kube import ApiError, Kube
from throttledjob.operator.observe import Readings, Seen
from throttledjob.operator.observed import status_with_split
from throttledjob.operator.reconcile import read_sidecars, resize_to_new_target
from throttledjob.operator.sidecar_status import HttpStatusReader
from throttledjob.operator.state import OperatorState
from throttledjob.operator.validation import SpecError, validate
from throttledjob.operator.writes import cpu_target, decide

TARGET = 1.0


def target_of(tj: dict[str, Any]) -> float | None:
    return cpu_target(tj["spec"], validate(tj))


def job_view(state: OperatorState, tj: dict[str, Any], pods: list[dict[str, Any]],
             reports: dict[str, dict[str, Any]]) -> tuple[float, list[Rank]]:
    """What a reconcile pass decides of these readings: the target and the ranks."""
    held = list(state.limits.refused.get(("ml", tj["metadata"]["name"]), {}))
    writes = decide(tj, validate(tj), Seen(readings=Readings("job-uid", pods, reports, [],
                                                             held)))
    return writes.target or 0.0, writes.split


def rank(uid: str, limit: float, use: float | None, rate: float | None = None,
         floor: float = 0.05) -> Rank:
    return Rank(uid, uid, int(uid[-1]) if uid[-1].isdigit() else None, limit, floor, use,
                rate)


def test_each_rank_gets_its_cost_of_a_step_so_the_ranks_keep_pace() -> None:
    # Lockstep under an even split: rank 1's step costs twice rank 0's; rank 1 uses its
    # whole half, rank 0 half of its half and waits at the barrier for the rest.
    even = [rank("r0", 0.5, 0.25, 2.0), rank("r1", 0.5, 0.5, 2.0)]
    assert shares(TARGET, even) == {"r0": 0.333, "r1": 0.666}
    # At that split both use all of theirs, at the same pace: it stays.
    fair = [rank("r0", 0.333, 0.333, 2.0), rank("r1", 0.666, 0.666, 2.0)]
    assert moves(TARGET, fair, shares(TARGET, fair)) == []


def test_the_sidecars_cost_of_a_step_over_its_window_weighs_the_ranks() -> None:
    # One interval's use and pace say rank 0 costs as much as rank 1 (a read that caught
    # a batch of rank 0's steps late); their costs over the sidecar's 10 s say 1 : 2.
    ranks_ = [Rank("r0", "r0", 0, 0.5, 0.05, 0.25, 1.0, cost=0.025),
              Rank("r1", "r1", 1, 0.5, 0.05, 0.5, 2.0, cost=0.05)]
    assert shares(TARGET, ranks_) == {"r0": 0.333, "r1": 0.666}
    # A sidecar from before the figure: by use over pace.
    ranks_[0] = Rank("r0", "r0", 0, 0.5, 0.05, 0.25, 1.0, cost=None)
    assert shares(TARGET, ranks_) == {"r0": 0.5, "r1": 0.5}
    # The figure as the sidecar's /status names it.
    found = ranks([pod("a", "a", "500m", index=0)],
                  {"a": {"observed": {"cpuCores": 0.3, "stepsPerSecond": 2.0,
                                      "cpuSecondsPerStep": 0.04}}}, lambda _: 0.05)
    assert found[0].cost == 0.04


def test_without_steps_the_split_follows_measured_use_with_a_floor() -> None:
    # Rank 0 reports no steps: both are weighed by their use; an idle rank keeps its floor.
    assert shares(TARGET, [rank("r0", 0.5, 0.2), rank("r1", 0.5, 0.5, 3.0)]) == {
        "r0": 0.285, "r1": 0.714}
    assert shares(TARGET, [rank("r0", 0.5, 0.0), rank("r1", 0.5, 0.5, floor=0.1)]) == {
        "r0": 0.05, "r1": 0.95}


def test_a_rank_not_read_keeps_its_limit_and_the_others_split_the_rest() -> None:
    got = shares(TARGET, [rank("r0", 0.5, None), rank("r1", 0.25, 0.25), rank("r2", 0.25,
                                                                               0.75)])
    assert got == {"r1": 0.125, "r2": 0.375}
    # Its resize refused: held at its limit too.
    held = Rank("r0", "r0", 0, 0.5, 0.05, 0.5, None, None, held=True)
    assert shares(TARGET, [held, rank("r1", 0.5, 0.1)]) == {"r1": 0.5}


def test_shrinks_go_first_and_a_grow_takes_only_the_room_left_now() -> None:
    ranks_ = [rank("r0", 0.5, 0.25, 2.0), rank("r1", 0.5, 0.5, 2.0)]
    # r0 shrinks to 0.333; r1's grow to 0.666 waits: r0 still holds 0.5 until the kubelet
    # applies the shrink (its spec says 0.333, its status 0.5: it counts at 0.5).
    assert moves(TARGET, ranks_, shares(TARGET, ranks_)) == [(ranks_[0], 0.333)]
    after = [rank("r0", 0.333, 0.25, 2.0), ranks_[1]]
    assert moves(TARGET, after, {"r0": 0.333, "r1": 0.666}) == [(after[1], 0.666)]
    # Moves within SPLIT_STEP of the limit are not made...
    there = [after[0], rank("r1", 0.666, 0.6, 2.0)]
    assert moves(TARGET, there, {"r0": 0.35, "r1": 0.65}) == []
    # ...except a shrink whose room a grow past the step needs (a DDP run's split stood
    # 32 s with rank 0 pinned at 0.304 core, wanting 0.354, and rank 1 at 0.695).
    pinned = [rank("r0", 0.304, 0.30, 10.0), rank("r1", 0.695, 0.55, 10.0)]
    assert moves(TARGET, pinned, {"r0": 0.354, "r1": 0.645}) == [(pinned[1], 0.645)]
    # ...and a grow within the step into room no rank holds (one run's ranks held 0.957).
    short = [rank("r0", 0.334, 0.33, 10.0), rank("r1", 0.623, 0.62, 10.0)]
    assert moves(TARGET, short, {"r0": 0.34, "r1": 0.659}) == [(short[0], 0.34),
                                                               (short[1], 0.659)]
    assert moves(TARGET, [short[0], rank("r1", 0.65, 0.62)], {"r0": 0.34, "r1": 0.659}) \
        == []   # 1.6% left: within ROOM_LEFT, as it is


def pod(name: str, uid: str, spec_limit: str, applied: str | None = None,
        phase: str = "Running", index: int | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if applied is not None:
        status["containerStatuses"] = [{"name": "work", "resources": {
            "limits": {"cpu": applied}}}]
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "uid": uid}
    if index is not None:
        meta["annotations"] = {job_split.COMPLETION_INDEX: str(index)}
    return {"metadata": meta, "status": status, "spec": {"containers": [
        {"name": "work", "resources": {"requests": {"cpu": "50m"},
                                       "limits": {"cpu": spec_limit}}}]}}


def test_a_pods_limit_counts_at_the_larger_of_its_spec_and_what_the_kubelet_applied() -> None:
    assert job_split.applied_limit(pod("a", "a", "333m", applied="500m")) == 0.5
    assert job_split.applied_limit(pod("a", "a", "666m", applied="500m")) == 0.666
    assert job_split.applied_limit(pod("a", "a", "250m")) == 0.25
    # Finished pods give their part back: they are no rank.
    found = ranks([pod("a", "a", "500m", phase="Succeeded"), pod("b", "b", "500m", index=1),
                   pod("c", "c", "500m", phase="Pending", index=0)], {}, lambda _: 0.05)
    assert [(r.name, r.index, r.movable) for r in found] == [("c", 0, False), ("b", 1, False)]


def test_the_split_waits_until_every_ranks_workload_has_run_the_sidecars_window() -> None:
    """While a rank starts (its workload waiting behind the sidecar, then importing, then
    at the rendezvous) its use says nothing of its cost: no rank moves until every
    workload has run PACE_WINDOW_SECONDS; then the split follows the costs."""
    now = 1_800_000_000.0

    def started(p: dict[str, Any], seconds_ago: float | None) -> dict[str, Any]:
        # As the API server writes it: UTC, whole seconds, "Z".
        state = {"waiting": {"reason": "PodInitializing"}} if seconds_ago is None else {
            "running": {"startedAt": datetime.datetime.fromtimestamp(
                now - seconds_ago, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}}
        p["status"]["containerStatuses"][0]["state"] = state
        return p

    # Rank 1 reads as if it cost nothing: waiting to start, then at the rendezvous.
    reports = {"u0": {"observed": {"cpuCores": 0.5}}, "u1": {"observed": {"cpuCores": 0.01}}}
    for ago in (None, 3.0, job_split.PACE_WINDOW_SECONDS - 1):
        pods = [started(pod("a", "u0", "500m", "500m", index=0), 30.0),
                started(pod("b", "u1", "500m", "500m", index=1), ago)]
        assert shares(TARGET, ranks(pods, reports, lambda _: 0.05, now=now)) == {}, ago
    pods = [started(pod("a", "u0", "500m", "500m", index=0), 30.0),
            started(pod("b", "u1", "500m", "500m", index=1), job_split.PACE_WINDOW_SECONDS)]
    assert shares(TARGET, ranks(pods, reports, lambda _: 0.05, now=now)) == {"u0": 0.95, "u1": 0.05}
    # A container of the workload that has done its part does not hold the split.
    pods[1]["spec"]["containers"].append({"name": "fetch"})
    pods[1]["status"]["containerStatuses"].append(
        {"name": "fetch", "state": {"terminated": {"exitCode": 0}}})
    assert job_split.settled(pods[1], now)


def test_while_a_rank_starts_limits_over_the_target_are_still_cut() -> None:
    """Rank 1 replaced mid-split starts at its even share (0.5) while rank 0 holds the
    0.7 it had grown to: 1.2 cores for a 1-core target. Rank 1 has not settled, so no
    rank is weighed by its figures, but the limits in force are cut back under the
    target, in proportion, by shrinks alone."""
    running = [Rank("r0", "r0", 0, 0.7, 0.05, 0.6, 2.0, cost=0.3),
               Rank("r1", "r1", 1, 0.5, 0.05, 0.01, None, settled=False)]
    wanted = shares(TARGET, running)
    assert wanted == {"r0": 0.583, "r1": 0.416}
    made = moves(TARGET, running, wanted)
    assert [(r.uid, v) for r, v in made] == [("r0", 0.583), ("r1", 0.416)]
    assert all(v < r.limit for r, v in made)


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 6), st.randoms(use_true_random=False), st.integers(3, 12))
def test_the_sum_of_the_limits_in_force_never_passes_the_target(
        n: int, rnd: random.Random, ticks: int) -> None:
    """Any use, any pace, ranks still starting or not, a kubelet that applies a resize at
    once, late or never: at every moment the limits in force (spec or applied, the
    larger) sum to at most the target; after a cut of the target, the limits asked come
    back under it at the first read of every rank, and stay there."""
    target, over = 0.1 * n + rnd.random() * 2, False
    spec = {i: int(target / n * 1000) / 1000 for i in range(n)}  # the even start
    applied = dict(spec)
    for tick in range(ticks):
        if tick == ticks // 2:   # the target cut by a live edit: the limits pass it
            target *= 0.5 + rnd.random() / 2
            over = True
        now = [dataclasses.replace(
                   rank(f"r{i}", max(spec[i], applied[i]),
                        None if rnd.random() < 0.2 else rnd.random() * max(spec[i], applied[i]),
                        rnd.choice([None, rnd.random() * 5 + 0.1]), floor=0.05),
                   settled=rnd.random() < 0.8)   # some ranks still starting
               for i in range(n)]
        for r, new in moves(target, now, shares(target, now)):
            spec[int(r.uid[1:])] = new
        # Once over the target, the asked limits come back under it at once (every rank
        # read: shrinks alone), the ones in force as the kubelet applies them.
        unread = any(r.use is None for r in now)
        if not (over and unread):
            assert sum(spec.values()) <= target + 1e-9
        if not over:
            assert sum(max(spec[i], applied[i]) for i in range(n)) <= target + 1e-9
        for i in range(n):  # the kubelet applies some resizes now, others later
            if rnd.random() < 0.6:
                applied[i] = spec[i]
        if sum(max(spec[i], applied[i]) for i in range(n)) <= target + 1e-9:
            over = False
        if not over:
            assert sum(max(spec[i], applied[i]) for i in range(n)) <= target + 1e-9


def indexed(**throttle: Any) -> dict[str, Any]:
    body = make_tj(throttle={"targets": {"cpu": {"peak": "1"}}, "scope": "Job", **throttle})
    body["spec"]["jobTemplate"]["spec"].update(
        {"completionMode": "Indexed", "completions": 2, "parallelism": 2})
    return body


def test_each_pod_starts_with_an_even_share_of_a_job_wide_target() -> None:
    body = indexed()
    job = build_child(body, validate(body), OperatorSettings())
    (work,) = job["spec"]["template"]["spec"]["containers"]
    assert work["resources"]["limits"]["cpu"] == "500m"
    # scope is the operator's: the sidecar's policy does not carry it.
    assert "scope" not in validate(body)


@pytest.mark.parametrize(("change", "message"), [
    ({"targets": {"gpu": {"peakPowerWatts": 200}, "cpu": {"peak": "1"}}},
     "job-wide GPU target is not supported"),
    ({"targets": {"cpu": {"peak": "0.08"}}}, "under the 0.1 cores its 2 pods need"),
    ({"enforcement": "Signals"}, "scope Job is held by the pods. CPU limits: enforcement must be "
                                 "Quota"),
])
def test_a_job_wide_target_that_cannot_be_held_is_refused(change: dict[str, Any],
                                                           message: str) -> None:
    body = indexed(**change)
    with pytest.raises(SpecError, match=message):
        validate(body)


def test_a_pods_own_limit_and_requests_are_weighed_against_its_even_share() -> None:
    """A DDP template with limits.cpu 2 per rank takes a job-wide 4 cores over 2 pods (2
    each, not 4 against one pod's 2); 5 cores would never bind. A request over the even
    share leaves no limit to set: refused, where each sidecar would otherwise have held
    its pod to the whole job-wide figure."""
    def with_resources(peak: str, **resources: Any) -> dict[str, Any]:
        body = indexed(targets={"cpu": {"peak": peak}})
        body["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0][
            "resources"] = resources
        return body

    validate(with_resources("4", limits={"cpu": "2"}))
    with pytest.raises(SpecError, match=r"2.5 cores for each of 2 pods\) exceeds the pod's "
                                        "CPU limit of 2 cores"):
        validate(with_resources("5", limits={"cpu": "2"}))
    body = with_resources("1", requests={"cpu": "800m"})
    body["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"].append(
        {"name": "loader", "image": "loader:1"})
    with pytest.raises(SpecError, match=r"cannot be set at each pod's even share: container "
                                        r"trainer requests 0.8 CPU"):
        validate(body)


def test_more_ranks_than_the_split_takes_are_refused() -> None:
    body = indexed()
    body["spec"]["jobTemplate"]["spec"]["parallelism"] = 65
    with pytest.raises(SpecError, match="at most 64 pods, not 65"):
        validate(body)


class Kubelet:
    """`pods/resize` on pods held here; the kubelet applies each at once unless told to
    defer, and refuses pods named in `refuse`."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.refuse: set[str] = set()
        self.defer = False
        self.calls: list[tuple[str, str]] = []

    def resize_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        if name in self.refuse:
            raise ApiError(422, "Pod is invalid: node too small")
        (c,) = patch["spec"]["containers"]
        cpu = c["resources"]["limits"]["cpu"]
        self.calls.append((name, cpu))
        pod = self.pods[name]
        pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] = cpu
        if not self.defer:
            pod["status"]["containerStatuses"][0]["resources"]["limits"]["cpu"] = cpu
        return {}

    def listed(self) -> list[dict[str, Any]]:
        return copy.deepcopy(list(self.pods.values()))


def report(use: float, rate: float, peak: float | None = None) -> dict[str, Any]:
    return {"observed": {"cpuCores": use, "stepsPerSecond": rate, "cpuPeakCores": peak or use}}


def test_the_operator_moves_the_split_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple[str, str]] = []
    monkeypatch.setattr(operator_events, "normal", lambda _b, reason, message: events.append(
        (reason, message)))
    monkeypatch.setattr(kopf, "warn", lambda _b, reason, message: events.append((reason,
                                                                                   message)))
    kubelet = Kubelet([pod("train-0", "u0", "500m", "500m", index=0),
                       pod("train-1", "u1", "500m", "500m", index=1)])
    state = OperatorState(OperatorSettings(), kubelet, HttpStatusReader(1))  # type: ignore[arg-type]
    tj = indexed()
    tj["metadata"]["namespace"] = "ml"

    def tick(reports: dict[str, dict[str, Any]]) -> tuple[float, list[Rank]]:
        pods = kubelet.listed()
        view = job_view(state, tj, pods, reports)
        state.limits.reconcile(tj, pods, reports, target_of(tj))
        return view

    # Rank 1 costs twice as much a step; the kubelet defers: rank 0 shrinks, rank 1 waits.
    kubelet.defer = True
    tick({"u0": report(0.25, 2.0), "u1": report(0.5, 2.0)})
    assert kubelet.calls == [("train-0", "333m")]
    assert events[-1] == ("SplitChanged", "job-wide CPU split moved to each pod's cost of "
                                          "a step (cores): train-0 0.333, train-1 0.5")
    tick({"u0": report(0.25, 2.0), "u1": report(0.5, 2.0)})
    assert kubelet.calls == [("train-0", "333m")]  # still deferred: no room yet
    kubelet.defer = False
    kubelet.pods["train-0"]["status"]["containerStatuses"][0]["resources"]["limits"][
        "cpu"] = "333m"
    target, _ = tick({"u0": report(0.25, 2.0), "u1": report(0.5, 2.0)})
    assert kubelet.calls[-1] == ("train-1", "666m")
    status = status_with_split({}, target, ranks(kubelet.listed(), {
        "u0": report(0.333, 3.0, 0.34), "u1": report(0.666, 3.0, 0.67)}, lambda _: 0.05),
        "now")
    assert status["jobWide"] == {"targetCores": 1.0, "limitCores": 0.999, "cpuCores": 0.999,
                                 "cpuPeakCores": 1.01}
    assert [(r["pod"], r["index"], r["limitCores"], r["stepsPerSecond"]) for r in
            status["ranks"]] == [("train-0", 0, 0.333, 3.0), ("train-1", 1, 0.666, 3.0)]
    (met,) = status["conditions"]
    assert (met["type"], met["status"], met["reason"]) == ("TargetMet", "True",
                                                           "LimitsWithinTarget")
    # Rank 0 ends: rank 1, running alone, gets the whole target.
    kubelet.pods["train-0"]["status"]["phase"] = "Succeeded"
    tick({"u1": report(0.666, 3.0)})
    assert kubelet.calls[-1] == ("train-1", "1000m")


class Cluster(Kubelet):
    """The poller's other calls too: the Job's pods, each with a real sidecar server on
    127.0.0.1, and the ThrottledJob's status in a dict. Every resize is checked against
    the promise: the limits in force never sum past the target."""

    def __init__(self, tj: dict[str, Any], sidecars: list[FakeSidecar]) -> None:
        pods = [pod(f"train-{i}", f"u{i}", "500m", "500m", index=i) for i in range(2)]
        for p, sidecar in zip(pods, sidecars, strict=True):
            p["metadata"]["ownerReferences"] = [{"uid": "job-uid"}]
            p["status"]["podIP"] = "127.0.0.1"
            p["spec"]["initContainers"] = [{"name": SIDECAR_CONTAINER, "ports": [
                {"name": "metrics", "containerPort": sidecar.port}]}]
        super().__init__(pods)
        self.tj = tj

    tj_path = staticmethod(Kube.tj_path)

    def get(self, path: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.tj) if path == Kube.tj_path("ml", "train") else None

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self.listed()

    def update_status(self, namespace: str, name: str, mutate: Any, read: Any = None) -> Any:
        old = dict(self.tj.get("status") or {})
        self.tj["status"] = new = mutate(dict(old), self.tj)
        return self.tj, old, new

    check = True  # each resize against the promise (a target cut passes it for a moment)

    def resize_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        out = super().resize_pod(namespace, name, patch)
        assert not self.check or sum(
            job_split.applied_limit(p) or 0 for p in self.listed()) <= self.target()
        return out

    def target(self) -> float:
        return float(self.tj["spec"]["throttle"]["targets"]["cpu"]["peak"]) + 1e-9

    def apply(self, name: str) -> None:
        """The kubelet applies the pod's deferred resize."""
        (c,) = self.pods[name]["status"]["containerStatuses"]
        c["resources"]["limits"]["cpu"] = self.pods[name]["spec"]["containers"][0][
            "resources"]["limits"]["cpu"]


@pytest.mark.parametrize(("applied_after", "cut"), [(0.2, False), (None, False), (0.2, True)])
def test_a_grow_follows_its_shrink_as_soon_as_the_kubelet_has_applied_it(
        monkeypatch: pytest.MonkeyPatch, applied_after: float | None, cut: bool) -> None:
    """One read of the sidecars: rank 1 costs twice rank 0 a step. Rank 0 shrinks; once
    the kubelet has applied that, rank 1 grows in the same read, not one status interval
    later. A shrink the kubelet has not applied by half the interval leaves the grow to
    the next read; a target cut meanwhile is the one grown to. The sum of the limits in
    force never passes the target."""
    monkeypatch.setattr(operator_events, "normal", lambda *a, **k: None)
    sidecars = [FakeSidecar(), FakeSidecar()]
    for sidecar, cost in zip(sidecars, (0.125, 0.25), strict=True):
        sidecar.doc = {"observed": {"cpuCores": cost * 2, "stepsPerSecond": 2.0,
                                    "cpuSecondsPerStep": cost}}
    tj = indexed()
    tj["metadata"]["namespace"] = "ml"
    cluster = Cluster(tj, sidecars)
    state = OperatorState(OperatorSettings(status_interval_seconds=4.0), cluster,  # type: ignore[arg-type]
                          HttpStatusReader(1))
    state.job_uids[("ml", tj["metadata"]["name"])] = "job-uid"
    cluster.defer = True
    if applied_after is not None:
        threading.Timer(applied_after, cluster.apply, ["train-0"]).start()
    if cut:   # an edit while the grow waits
        threading.Timer(0.1, lambda: tj["spec"]["throttle"]["targets"]["cpu"].update(
            peak="0.9")).start()
    began = time.monotonic()
    read_sidecars(state, "ml", tj["metadata"]["name"])
    took = time.monotonic() - began
    for sidecar in sidecars:
        sidecar.close()
    if cut:
        assert cluster.calls == [("train-0", "333m"), ("train-0", "300m"), ("train-1", "567m")]
    elif applied_after is None:
        assert cluster.calls == [("train-0", "333m")]
        assert took < 3.0  # half the status interval (2 s), and the read
    else:
        assert cluster.calls == [("train-0", "333m"), ("train-1", "666m")]
        assert took < 1.5  # not held to the end of the wait


def test_a_live_edit_of_a_job_wide_target_moves_the_split_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The target cut from 1 to 0.6 core: the handler reads the ranks' sidecars and
    moves them now (it passed no figures, so no rank could move before the next read)."""
    monkeypatch.setattr(operator_events, "normal", lambda *a, **k: None)
    sidecars = [FakeSidecar(), FakeSidecar()]
    for sidecar in sidecars:
        sidecar.doc = {"observed": {"cpuCores": 0.5, "stepsPerSecond": 2.0,
                                    "cpuSecondsPerStep": 0.25}}
    tj = indexed()
    tj["metadata"]["namespace"] = "ml"
    tj["spec"]["throttle"]["targets"]["cpu"]["peak"] = "0.6"
    tj["status"] = {"jobName": "train"}
    cluster = Cluster(tj, sidecars)
    cluster.check = False
    state = OperatorState(OperatorSettings(), cluster, HttpStatusReader(1))  # type: ignore[arg-type]
    state.job_uids[("ml", "train")] = "job-uid"
    resize_to_new_target(state, tj, target_of(tj))
    for sidecar in sidecars:
        sidecar.close()
    assert cluster.calls == [("train-0", "300m"), ("train-1", "300m")]


def test_a_rank_the_api_server_will_not_resize_holds_its_limit_and_the_others_do_not_grow(
        monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple[str, str]] = []
    monkeypatch.setattr(operator_events, "normal", lambda *a, **k: None)
    monkeypatch.setattr(kopf, "warn", lambda _b, reason, message: events.append((reason,
                                                                                   message)))
    kubelet = Kubelet([pod("train-0", "u0", "500m", "500m", index=0),
                       pod("train-1", "u1", "500m", "500m", index=1)])
    kubelet.refuse = {"train-0"}
    state = OperatorState(OperatorSettings(), kubelet, HttpStatusReader(1))  # type: ignore[arg-type]
    tj = indexed()
    tj["metadata"]["namespace"] = "ml"
    for _ in range(3):
        pods = kubelet.listed()
        state.limits.reconcile(tj, pods, {"u0": report(0.1, 2.0), "u1": report(0.5, 2.0)},
                               target_of(tj))
    assert [reason for reason, _ in events] == ["QuotaResizeRefused"]  # asked once
    assert kubelet.calls == []  # rank 1 is not grown past what rank 0 still holds


def test_a_silent_sidecar_a_deleted_pod_and_an_operator_restart_mid_split(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The split lives in the pods (their limits, asked and applied), not in the operator:
    an operator started anew mid-split picks it up where the cluster is, and no fault
    lets the limits in force pass the target."""
    monkeypatch.setattr(operator_events, "normal", lambda *a, **k: None)
    kubelet = Kubelet([pod(f"train-{i}", f"u{i}", "333m", "333m", index=i) for i in range(3)])
    tj = indexed()
    tj["metadata"]["namespace"] = "ml"
    tj["spec"]["jobTemplate"]["spec"].update(completions=3, parallelism=3)

    def tick(state: OperatorState, reports: dict[str, dict[str, Any]]) -> None:
        pods = kubelet.listed()
        state.limits.reconcile(tj, pods, reports, target_of(tj))
        assert sum(job_split.applied_limit(p) or 0 for p in kubelet.listed()) <= 1.0 + 1e-9

    def fresh() -> OperatorState:
        return OperatorState(OperatorSettings(), kubelet, HttpStatusReader(1))  # type: ignore[arg-type]

    # Rank 2's sidecar stops answering: it keeps its 333m; ranks 0 and 1 split the
    # other 667m by their costs (0.1 and 0.333 a step): 154m and 512m.
    kubelet.defer = True
    tick(fresh(), {"u0": report(0.1, 1.0), "u1": report(0.333, 1.0)})
    assert kubelet.calls == [("train-0", "154m")]
    # The operator restarts before the kubelet applied that shrink: the new one sees
    # rank 0 at 333m still (its status), so rank 1 does not grow yet.
    tick(fresh(), {"u0": report(0.1, 1.0), "u1": report(0.333, 1.0)})
    assert kubelet.calls == [("train-0", "154m")]
    kubelet.defer = False
    kubelet.pods["train-0"]["status"]["containerStatuses"][0]["resources"]["limits"][
        "cpu"] = "154m"
    tick(fresh(), {"u0": report(0.1, 1.0), "u1": report(0.333, 1.0)})
    assert kubelet.calls[-1] == ("train-1", "512m")
    # Rank 2 deleted mid-run: its 333m go back to the ranks that run.
    del kubelet.pods["train-2"]
    tick(fresh(), {"u0": report(0.154, 1.0), "u1": report(0.512, 1.0)})
    assert kubelet.calls[-2:] == [("train-0", "231m"), ("train-1", "768m")]


def test_a_pod_being_deleted_is_never_cut_and_its_share_goes_to_the_ranks_that_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 is evicted: it runs on through its grace period (phase Running, a
    deletionTimestamp) while the Job controller has made its replacement. It keeps its
    limit (it may be saving a checkpoint) and is no rank: rank 0 is not cut to make room
    for it, nor listed twice at index 1."""
    monkeypatch.setattr(operator_events, "normal", lambda *a, **k: None)
    leaving = pod("train-1", "u1", "500m", "500m", index=1)
    leaving["metadata"]["deletionTimestamp"] = "2026-11-28T10:00:00Z"
    kubelet = Kubelet([pod("train-0", "u0", "500m", "500m", index=0), leaving,
                       pod("train-1-b", "u2", "500m", phase="Pending", index=1)])
    state = OperatorState(OperatorSettings(), kubelet, HttpStatusReader(1))  # type: ignore[arg-type]
    tj = indexed()
    tj["metadata"]["namespace"] = "ml"
    reports = {"u0": report(0.5, 1.0), "u1": report(0.5, 1.0)}
    pods = kubelet.listed()
    state.limits.reconcile(tj, pods, reports, target_of(tj))
    assert kubelet.calls == []
    assert [r.name for r in job_view(state, tj, pods, reports)[1]] == ["train-0", "train-1-b"]


def test_the_status_figures_are_the_ones_the_schema_is_generated_from() -> None:
    """status.ranks[] and status.jobWide carry exactly the figures of RANK_FIGURES and
    JOB_WIDE_FIGURES, which the CRD's schema is generated from: a figure added to one
    and not the other would be pruned by the API server, or be a schema with no value."""
    r = rank("r0", 0.5, 0.4, 2.0)
    assert set(job_split.rank_status(r)) == {"pod", "index", *job_split.RANK_FIGURES}
    assert set(job_split.job_wide(1.0, [r])) == set(job_split.JOB_WIDE_FIGURES)


def test_a_job_grown_past_the_ranks_the_status_takes_still_gets_its_status() -> None:
    """Parallelism raised on the Job after creation (it is mutable): status.ranks keeps
    the schema's bound, so the API server does not refuse every status write; the
    job-wide figures count every pod."""
    many = [Rank(f"p{i}", f"u{i}", i, 0.01, 0.01, 0.01, 1.0) for i in range(70)]
    status = status_with_split({}, 1.0, many, "now")
    assert len(status["ranks"]) == 64 and status["jobWide"]["limitCores"] == 0.7
