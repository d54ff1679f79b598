"""The status poller: which reads are due, and that a slow sidecar delays only its own
ThrottledJob. Real sidecar servers on 127.0.0.1 (one answers, one dribbles its answer as a
slow-loris would); the API is a small in-memory stand-in, since only the timing of the
status writes is under test here."""

from __future__ import annotations

import copy
import logging
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import kopf
import pytest

from testing.fake_sidecar import FakeSidecar
from testing.helpers import require_tool, wait_for
from testing.http import free_port
from throttledjob.operator import events as operator_events
from throttledjob.operator import metrics as operator_metrics
from throttledjob.operator.api_names import SIDECAR_CONTAINER
from throttledjob.operator.config import OperatorSettings
from throttledjob.operator.kube import ApiError, Kube
from throttledjob.operator.poller import due, poll
from throttledjob.operator.reconcile import read_sidecars, resync_from_job
from throttledjob.operator.sidecar_status import HttpStatusReader
from throttledjob.operator.state import OperatorState
from throttledjob.operator.validation import policy_document
from throttledjob.operator.writes import cpu_target

STATUS_DOC = {"observed": {"cpuPeakCores": 1.0, "cpuMaxCores": 1.9,
                           "gpuPeakUtilizationPercent": None, "gpuPeakPowerWatts": None,
                           "throttleLevel": 0.4, "slowdown": 1.12},
              "targetMet": True, "budgetExhausted": False, "levers": ["pacing"], "errors": []}
DEADLINE = 2.0  # the reader's, as the operator's default


class SlowLoris:
    """Accepts, then answers one byte every `every` seconds, never finishing in time."""

    def __init__(self, every: float = 0.1) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.every = every
        self.connections = 0
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._dribble, args=(conn,), daemon=True).start()

    def _dribble(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(4096)
            answer = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + b" " * 4096
            for byte in answer:
                if self.closed.wait(self.every):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:  # the reader gave up, as it should
                    return

    def close(self) -> None:
        self.closed.set()
        self.sock.close()


class MemoryKube:
    """The three calls the poller makes, on ThrottledJobs, other objects (by path) and
    pods held in dicts."""

    def __init__(self) -> None:
        self.tjs: dict[tuple[str, str], dict[str, Any]] = {}
        self.objects: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, list[dict[str, Any]]] = {}
        self.lock = threading.Lock()

    tj_path = staticmethod(Kube.tj_path)

    def get(self, path: str) -> dict[str, Any] | None:
        with self.lock:
            found = [tj for (ns, name), tj in self.tjs.items() if path == Kube.tj_path(ns, name)]
            found += [o for p, o in self.objects.items() if p == path]
            return copy.deepcopy(found[0]) if found else None

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.pods.get(selector.split("=", 1)[1], []))

    def update_status(self, namespace: str, name: str, mutate: Any, read: Any = None) -> Any:
        with self.lock:
            tj = self.tjs[(namespace, name)]
            old = dict(tj.get("status") or {})
            tj["status"] = new = mutate(dict(old), tj)
            return tj, old, new


def pod(name: str, job_uid: str, port: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "ownerReferences": [{"uid": job_uid}]},
            "status": {"phase": "Running", "podIP": "127.0.0.1"},
            "spec": {"initContainers": [{"name": SIDECAR_CONTAINER, "ports": [
                {"name": "metrics", "containerPort": port}]}], "containers": []}}


@pytest.fixture
def world() -> Iterator[tuple[OperatorState, FakeSidecar, SlowLoris]]:
    """ThrottledJob `fast`, whose sidecar answers, and `slow`, whose sidecar dribbles."""
    fast, slow = FakeSidecar(), SlowLoris()
    fast.doc = STATUS_DOC
    kube = MemoryKube()
    settings = OperatorSettings(status_interval_seconds=0.1, status_timeout_seconds=DEADLINE,
                                resync_seconds=3600)
    state = OperatorState(settings, kube, HttpStatusReader(DEADLINE))  # type: ignore[arg-type]
    for name, port in (("fast", fast.port), ("slow", slow.port)):
        kube.tjs[("ml", name)] = {"metadata": {"name": name, "namespace": "ml"}, "status": {}}
        kube.pods[name] = [pod(f"{name}-0", f"uid-{name}", port)]
        state.seen[("ml", name)] = ("Running", name)
        state.job_uids[("ml", name)] = f"uid-{name}"
    yield state, fast, slow
    state.stop.set()
    slow.close()
    fast.close()


def observed(state: OperatorState, name: str) -> dict[str, Any]:
    return state.kube.tjs[("ml", name)]["status"].get("observed") or {}  # type: ignore[attr-defined]


def test_a_slow_sidecar_does_not_delay_another_throttledjobs_status(
        world: tuple[OperatorState, FakeSidecar, SlowLoris]) -> None:
    state, fast, slow = world
    threading.Thread(target=poll, args=(state, logging.getLogger("test")), daemon=True).start()
    wait_for(lambda: observed(state, "fast").get("cpuPeakCores") == 1.0, 5,
             what="the first read of the fast sidecar")
    # The slow sidecar's read has begun and runs to its deadline; the fast one's next
    # reading must still reach the status at the status interval, not after that read.
    wait_for(lambda: slow.connections == 1, 5, what="the slow sidecar's read")
    fast.doc = {**STATUS_DOC, "observed": {**STATUS_DOC["observed"], "cpuPeakCores": 1.7}}
    changed = time.monotonic()
    wait_for(lambda: observed(state, "fast").get("cpuPeakCores") == 1.7, DEADLINE,
             interval=0.01, what="the fast sidecar's new peak")
    assert time.monotonic() - changed < DEADLINE / 3
    assert observed(state, "slow") == {}  # its read is still in flight...
    assert slow.connections == 1  # ...and was not started again behind itself
    wait_for(lambda: observed(state, "slow").get("errors"), DEADLINE + 2,
             what="the slow read cut off at its deadline")
    assert "timed out" in observed(state, "slow")["errors"][0]


def test_due_reads_follow_the_phase() -> None:
    seen = {("ml", "run"): ("Running", "run"), ("ml", "wait"): ("Pending", "wait"),
            ("ml", "done"): ("Succeeded", "done"), ("ml", "new"): (None, None)}
    assert due(seen, resync=False) == [(read_sidecars, "ml", "run", "run")]
    assert due(seen, resync=True) == [(read_sidecars, "ml", "run", "run"),
                                      (resync_from_job, "ml", "run", "run"),
                                      (resync_from_job, "ml", "wait", "wait")]


class ResizingKube(MemoryKube):
    """Records `pods/resize` patches; refuses a pod more than `max_cores` (as a cluster's
    admission policy on pods/resize may: the live test has one)."""

    def __init__(self, max_cores: float) -> None:
        super().__init__()
        self.max_cores = max_cores
        self.patches: list[dict[str, Any]] = []

    def resize_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        asked = sum(int(c["resources"]["limits"]["cpu"].rstrip("m"))
                    for c in patch["spec"]["containers"])
        if asked > self.max_cores * 1000:
            raise ApiError(403, "pods \"train-0\" is forbidden: ValidatingAdmissionPolicy "
                                "denied request: no container over 2 CPU")
        self.patches.append(patch)
        return {}


def lift(state: OperatorState, tj: dict[str, Any],
         read: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    """One read of the sidecars: each pod with its sidecar's report."""
    state.limits.reconcile(tj, [pod for pod, _ in read],
                           {pod["metadata"]["uid"]: report for pod, report in read},
                           cpu_target(tj["spec"], policy_document(tj["spec"])))


def test_the_budget_lifts_a_pods_limits_and_a_refused_size_is_not_asked_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple[str, str]] = []
    monkeypatch.setattr(operator_events, "normal", lambda _body, reason, message: events.append(
        (reason, message)))
    monkeypatch.setattr(kopf, "warn", lambda _body, reason, message: events.append(
        (reason, message)))
    kube = ResizingKube(max_cores=2)
    state = OperatorState(OperatorSettings(), kube, HttpStatusReader(DEADLINE))  # type: ignore[arg-type]
    tj = {"metadata": {"name": "train", "namespace": "ml"}, "spec": {
        "jobTemplate": {"spec": {"template": {"spec": {"containers": [
            {"name": "work", "image": "train:1"}]}}}},
        "throttle": {"targets": {"cpu": {"peak": "1"}}, "enforcement": "Quota",
                     "maxSlowdown": 1.25}}}

    def running(limit: str) -> dict[str, Any]:
        # No request in the template: the API server defaulted it to the operator's limit.
        return {"metadata": {"name": "train-0", "namespace": "ml", "uid": "u1"},
                "status": {"phase": "Running"},
                "spec": {"containers": [{"name": "work", "resources": {
                    "requests": {"cpu": limit}, "limits": {"cpu": limit}}}]}}

    def wants(cores: float | None) -> dict[str, Any]:
        return {**STATUS_DOC, "cpuLimitWantedCores": cores}

    # Two busy threads held to 1 core wait half the time; maxSlowdown 1.25 allows 20%: the
    # sidecar asks for 1.6 cores, and gets them (the limit: a Burstable pod's request is
    # not raised, which would need room on the node).
    lift(state, tj, [(running("1000m"), wants(1.6))])
    assert kube.patches[-1] == {"spec": {"containers": [{"name": "work", "resources": {
        "limits": {"cpu": "1600m"}}}]}}
    assert events[-1][0] == "QuotaLifted" and "1.6 cores" in events[-1][1]
    # Nothing more while it has them, or a lift within 10% of them (the width behind it
    # is measured anew each interval); back to the target when the budget allows it.
    lift(state, tj, [(running("1600m"), wants(1.6))])
    lift(state, tj, [(running("1600m"), wants(1.5))])
    assert len(kube.patches) == 1
    lift(state, tj, [(running("1600m"), wants(None))])
    assert kube.patches[-1]["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "1000m"}
    assert events[-1][0] == "QuotaResized"
    # Refused (an admission policy, a ResourceQuota): once, with a Warning, and not asked
    # for again.
    for _ in range(3):
        lift(state, tj, [(running("1000m"), wants(3.0))])
    assert [reason for reason, _ in events].count("QuotaResizeRefused") == 1
    assert len(kube.patches) == 2
    assert state.limits.refused == {("ml", "train"): {"u1": 3.0}}
    # That pod gone (a retry's pod read instead): nothing is kept for it.
    lift(state, tj, [({**running("1000m"), "metadata": {
        "name": "train-1", "namespace": "ml", "uid": "u2"}}, wants(None))])
    assert state.limits.refused == {}
    # A spec that enforces with signals: limits are not the operator's to move.
    signals = {**tj, "spec": {**tj["spec"], "throttle": {**tj["spec"]["throttle"],
                                                         "enforcement": "Signals"}}}
    lift(state, signals, [(running("1000m"), wants(1.6))])
    assert len(kube.patches) == 2


@pytest.mark.parametrize(("requests", "lifted"), [(None, None), ("800m", None), ("1", None)])
def test_under_kueue_a_lift_stays_within_the_admitted_requests(
        monkeypatch: pytest.MonkeyPatch, requests: str | None, lifted: str | None) -> None:
    """Kueue admits a queued Job's pods by their requests (the limit where none is set:
    the target's share). The budget's lift would take more than was admitted: it stops
    at the template's requests, and where there are none it does not lift at all. A
    request is never over the limit the target sets (quota.py: such a spec gets no
    limits), so under Kueue no lift passes the limit."""
    monkeypatch.setattr(operator_events, "normal", lambda *a, **k: None)
    kube = ResizingKube(max_cores=4)
    state = OperatorState(OperatorSettings(), kube, HttpStatusReader(DEADLINE))  # type: ignore[arg-type]
    work = {"name": "work", "image": "train:1",
            **({"resources": {"requests": {"cpu": requests}}} if requests else {})}
    tj = {"metadata": {"name": "train", "namespace": "ml",
                       "labels": {"kueue.x-k8s.io/queue-name": "team"}}, "spec": {
        "jobTemplate": {"spec": {"template": {"spec": {"containers": [work]}}}},
        "throttle": {"targets": {"cpu": {"peak": "1"}}, "enforcement": "Quota"}}}
    pod = {"metadata": {"name": "train-0", "namespace": "ml", "uid": "u1"},
           "status": {"phase": "Running"},
           "spec": {"containers": [{"name": "work", "resources": {
               "requests": {"cpu": requests or "1"}, "limits": {"cpu": "1"}}}]}}
    lift(state, tj, [(pod, {**STATUS_DOC, "cpuLimitWantedCores": 1.6})])
    got = [p["spec"]["containers"][0]["resources"]["limits"]["cpu"] for p in kube.patches]
    assert got == ([lifted] if lifted else [])


def test_the_limit_is_split_by_what_each_container_wanted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workload containers with the same request: the trainer held back at half the
    target while the log shipper idles under its half; split by their use instead."""
    events: list[tuple[str, str]] = []
    monkeypatch.setattr(operator_events, "normal", lambda _body, reason, message: events.append(
        (reason, message)))
    kube = ResizingKube(max_cores=2)
    state = OperatorState(OperatorSettings(), kube, HttpStatusReader(DEADLINE))  # type: ignore[arg-type]
    containers = [{"name": n, "image": "i", "resources": {"requests": {"cpu": "100m"}}}
                  for n in ("train", "logs")]
    tj = {"metadata": {"name": "train", "namespace": "ml"}, "spec": {
        "jobTemplate": {"spec": {"template": {"spec": {"containers": containers}}}},
        "throttle": {"targets": {"cpu": {"peak": "1"}}, "enforcement": "Quota"}}}
    pod = {"metadata": {"name": "train-0", "namespace": "ml", "uid": "u1"},
           "status": {"phase": "Running"},
           "spec": {"containers": [{**c, "resources": {**c["resources"], "limits": {
               "cpu": "500m"}}} for c in containers]}}
    lift(state, tj, [(pod, {**STATUS_DOC, "cpuDemandCores": {
        "train": 2.0, "logs": 0.05}})])
    (patch,) = kube.patches
    assert [(c["name"], c["resources"]["limits"]["cpu"]) for c in patch["spec"][
        "containers"]] == [("train", "900m"), ("logs", "100m")]
    assert events == [("QuotaResized", "pod train-0: CPU limits resized to the 1-core "
                                       "target (train 900m, logs 100m)")]
    def applied() -> list[str]:
        for c, new in zip(pod["spec"]["containers"], kube.patches[-1]["spec"]["containers"],
                          strict=True):
            c["resources"]["limits"] = new["resources"]["limits"]
        return [c["resources"]["limits"]["cpu"] for c in pod["spec"]["containers"]]

    applied()
    # The sidecar restarted (no interval measured yet), or is an older one: the split
    # stays as it is, and a lift keeps it.
    lift(state, tj, [(pod, STATUS_DOC)])
    assert len(kube.patches) == 1
    lift(state, tj, [(pod, {**STATUS_DOC, "cpuLimitWantedCores": 1.5})])
    assert applied() == ["1350m", "150m"]
    # Back to the target, the log shipper gone (named no more): the trainer gets all but
    # the shipper's request.
    lift(state, tj, [(pod, {**STATUS_DOC, "cpuDemandCores": {
        "train": 2.0}})])
    assert applied() == ["900m", "100m"] and len(kube.patches) == 3


def test_a_child_is_found_at_the_kind_it_was_made_whatever_the_spec_says_now() -> None:
    """A spec switched from jobTemplate to jobSetTemplate after its Job was made: the Job
    is still found (read as gone, the ThrottledJob was failed while its Job ran); and
    where the operator may not read the other kind (403), it is simply not there."""
    from throttledjob.operator import child
    from throttledjob.operator.observe import get_child

    class Api:
        def __init__(self, there: str | None, jobsets_forbidden: bool = False) -> None:
            self.there, self.forbidden = there, jobsets_forbidden

        def get(self, path: str) -> dict[str, Any] | None:
            kind = path.split("/")[-2]
            if kind == "jobsets" and self.forbidden:
                raise ApiError(403, "jobsets.jobset.x-k8s.io is forbidden")
            return {"path": path} if kind == self.there else None

    job = child.path("ml", "train", False)
    assert get_child(Api("jobs"), "ml", "train", jobset=True) == {"path": job}
    assert get_child(Api(None, jobsets_forbidden=True), "ml", "train", jobset=False) is None


def test_an_attached_workloads_end_shows_at_the_next_read_not_the_resync(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A workload someone else made carries no label of ours, so no watch of ours sees it
    end: the sidecars' tick reads it too, and the ThrottledJob ends with it."""
    from throttledjob.operator import child

    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)
    kube = MemoryKube()
    job = {"kind": "Job", "metadata": {"name": "user-job", "uid": "uid-job"},
           "status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}}
    kube.objects[child.path("ml", "user-job", False)] = job
    kube.tjs[("ml", "hold")] = {
        "metadata": {"name": "hold", "namespace": "ml", "uid": "uid-tj", "generation": 1},
        "spec": {"workloadRef": {"apiVersion": "batch/v1", "kind": "Job", "name": "user-job"},
                 "throttle": {"targets": {"cpu": {"peak": "1"}}}},
        "status": {"phase": "Running", "jobName": "user-job"}}
    state = OperatorState(OperatorSettings(resync_seconds=3600), kube,  # type: ignore[arg-type]
                          HttpStatusReader(DEADLINE))
    state.attached.add(("ml", "hold"))
    state.job_uids[("ml", "hold")] = "uid-job"
    read_sidecars(state, "ml", "hold", "user-job")
    assert kube.tjs[("ml", "hold")]["status"]["phase"] == "Succeeded"


def test_the_operator_serves_what_it_read_and_failed_as_prometheus_metrics(
        world: tuple[OperatorState, FakeSidecar, SlowLoris]) -> None:
    """Its own /metrics: each sidecar read by result (the slow one fails at its deadline),
    its ThrottledJobs by phase; text promtool accepts."""
    state, _, _ = world
    def count(result: str) -> float:
        return operator_metrics.REGISTRY.get_sample_value(
            "throttledjob_operator_sidecar_reads_total", {"result": result}) or 0.0

    before = {r: count(r) for r in ("success", "failure")}
    port = free_port()
    operator_metrics.serve(port, lambda: state.seen, "127.0.0.1")
    threading.Thread(target=poll, args=(state, logging.getLogger("test")), daemon=True).start()
    wait_for(lambda: count("success") >= before["success"] + 2
             and count("failure") >= before["failure"] + 1, 10,
             what="reads of the answering and the silent sidecar")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    assert 'throttledjob_operator_throttledjobs{phase="Running"} 2.0' in text
    assert 'throttledjob_operator_sidecar_reads_total{result="failure"}' in text
    check = subprocess.run([require_tool("promtool"), "check", "metrics"], input=text,
                           capture_output=True, text=True, timeout=30)
    assert check.returncode == 0 and not (check.stdout + check.stderr).strip(), \
        check.stdout + check.stderr
