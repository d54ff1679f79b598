"""The operator under API failures and crashes: each failure the emulator plays is retried
with backoff, nothing is created twice, and a restart at the worst moment ends with exactly
one Job and a true status."""

from __future__ import annotations

import logging
from pathlib import Path

import kopf
import pytest
import yaml

from testing.emulator import (
    CM_PATH,
    JOBS_PATH,
    TIMEOUT,
    TJ_PATH,
    VERBS,
    Emulator,
    Fault,
    assert_valid_status,
    cond,
    jobs_of,
    status,
)
from testing.helpers import wait_for
from testing.manifests import make_tj
from testing.operator_process import OperatorProcess, handler_memo
from throttledjob.operator import handlers, kube

JSON = "application/json"


def created_once(emu: Emulator, name: str) -> None:
    """One Job and one ConfigMap for `name`, status pointing at the Job, Ready."""
    wait_for(lambda: status(emu, name).get("jobName") == name, TIMEOUT, what="status.jobName")
    assert len(jobs_of(emu, name)) == 1
    assert [c["metadata"]["name"] for c in emu.items(CM_PATH)
            if c["metadata"]["name"].startswith(f"{name}-")] == [f"{name}-throttle"]
    assert cond(emu, name, "Ready")["status"] == "True"
    assert_valid_status(emu, name)


def test_backoff_is_jittered_bounded_and_honours_retry_after() -> None:
    delays = [kube.backoff_seconds(n) for n in range(12) for _ in range(20)]
    assert all(0 <= d <= 5.0 for d in delays)
    assert max(kube.backoff_seconds(0) for _ in range(50)) <= 0.2
    assert len({round(d, 6) for d in delays}) > 100  # jitter: no thundering herd
    assert kube.backoff_seconds(0, retry_after=3) >= 3
    assert kube.backoff_seconds(0, retry_after=10_000) == 60.0
    assert {e: kube.ApiError(e, "x").transient for e in (0, 409, 410, 429, 500, 503)} == {
        0: True, 409: False, 410: False, 429: True, 500: True, 503: True}


def test_transient_errors_are_retried_and_nothing_is_duplicated(
        emulator: Emulator, operator_process: OperatorProcess) -> None:
    faults = [
        Fault("POST", r"/configmaps$", status=429, times=2, retry_after=1),
        Fault("POST", r"/jobs$", status=503),  # refused before doing anything
        Fault("POST", r"/jobs$", status=500, after_commit=True),  # done, answer lost
        Fault("GET", r"/throttledjobs/flaky$", status=500),
        Fault("PATCH", r"/throttledjobs/flaky/status$", status=409, times=2),
        Fault("PATCH", r"/throttledjobs/flaky/status$", status=502),
    ]
    emulator.handler.faults.extend(faults)
    operator_process.start()
    emulator.call("POST", TJ_PATH, make_tj("flaky"), content_type=JSON)
    created_once(emulator, "flaky")
    assert [f.hits for f in faults] == [f.times for f in faults]  # each fault was played
    assert status(emulator, "flaky")["phase"] == "Pending"
    # Three POSTs: refused (never reached the store), done with the answer lost, and the
    # retry, which met 409 and adopted the Job that exists instead of making another.
    assert len(emulator.sent("CREATE", "/jobs")) == 2
    log = operator_process.full_log()
    assert "HTTP 429" in log and "retry" in log


def test_a_timeout_after_the_server_acted_creates_no_duplicate(
        emulator: Emulator, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The Job create and the status write reach the store, but their answers come after
    the client gave up: the retries adopt the Job and see the status written. The create
    handler is called directly: kopf's watch and retries add nothing here."""
    late = Fault("POST", r"/jobs$", status=None, delay=2.5, after_commit=True)
    slow_status = Fault("PATCH", r"/throttledjobs/slow/status$", status=None, delay=2.5,
                        after_commit=True)
    emulator.handler.faults.extend([late, slow_status])
    memo = handler_memo(emulator.write_kubeconfig(tmp_path / "kubeconfig"),
                        api_timeout_seconds=1)
    tj = emulator.call("POST", TJ_PATH, make_tj("slow"), content_type=JSON)
    handlers.reconcile(body=kopf.Body(tj), memo=memo, logger=logging.getLogger("test"))
    created_once(emulator, "slow")
    assert late.hits == 1 and slow_status.hits == 1
    assert "no answer from the API server" in caplog.text


def test_410_gone_on_the_watch_restarts_it_and_loses_nothing(
        emulator: Emulator, operator_process: OperatorProcess) -> None:
    operator_process.start()
    emulator.call("POST", TJ_PATH, make_tj("before"), content_type=JSON)
    created_once(emulator, "before")
    emulator.watch_error("throttledjobs", 410)
    emulator.watch_error("jobs", 410)
    # Events after the error: a new object and an edit of the old one.
    emulator.call("POST", TJ_PATH, make_tj("after"), content_type=JSON)
    emulator.call("PATCH", f"{TJ_PATH}/before", {"spec": {"throttle": {"targets": {
        "cpu": {"peak": "700m"}}}}})
    created_once(emulator, "after")
    wait_for(lambda: peak_in_configmap(emulator, "before") == "700m", TIMEOUT,
             what="the edit after the 410")
    assert len(jobs_of(emulator, "before")) == 1
    # The Job watch restarted too: a Job status change still reaches the ThrottledJob.
    emulator.call("PATCH", f"{JOBS_PATH}/after/status", {"status": {"active": 1}})
    wait_for(lambda: status(emulator, "after").get("phase") == "Running", TIMEOUT,
             what="phase Running after the 410")
    assert "Restarting the watch-stream for throttledjobs" in operator_process.full_log()


@pytest.mark.parametrize("moment", ["after-configmap", "after-job"])
def test_killed_mid_create_restarts_to_one_job_and_a_true_status(
        emulator: Emulator, operator_process: OperatorProcess, moment: str) -> None:
    """SIGKILL while the Job create hangs: before the server made it (the ConfigMap exists,
    the Job does not) or after (the Job exists, the status does not say so)."""
    hang = Fault("POST", r"/jobs$", status=None, delay=20, after_commit=moment == "after-job")
    emulator.handler.faults.append(hang)
    operator_process.start()
    emulator.call("POST", TJ_PATH, make_tj("crash"), content_type=JSON)
    wait_for(lambda: hang.hits == 1, TIMEOUT, what="the Job create to hang")
    assert emulator.call("GET", f"{CM_PATH}/crash-throttle") is not None
    if moment == "after-job":
        wait_for(lambda: jobs_of(emulator, "crash"), TIMEOUT, what="the Job, answer pending")
    assert not status(emulator, "crash").get("jobName")
    operator_process.kill()
    if moment == "after-job":
        # While the operator is down, the Job controller starts the pod.
        emulator.call("PATCH", f"{JOBS_PATH}/crash/status", {"status": {
            "active": 1, "startTime": "2026-01-01T00:00:00Z"}})
    operator_process.start()
    created_once(emulator, "crash")
    expected = "Running" if moment == "after-job" else "Pending"
    wait_for(lambda: status(emulator, "crash").get("phase") == expected, TIMEOUT,
             what=f"phase {expected}")
    assert len(jobs_of(emulator, "crash")) == 1
    if moment == "after-job":
        assert status(emulator, "crash")["startTime"] == "2026-01-01T00:00:00Z"


def test_an_older_kueue_that_serves_workloads_only_at_v1beta1_is_found_there(
        emulator: Emulator, tmp_path: Path) -> None:
    """Kueue before v0.15 answers 404 at v1beta2 (a server with Kueue 0.19, as the test
    cluster's, never does): the Workload is read, and held inactive, at v1beta1."""
    from throttledjob.operator.kueue import active_patch, workload_path

    emulator.handler.resources["kueue.x-k8s.io/v1beta1/workloads"] = dict(
        kind="Workload", namespaced=True, singular="workload", verbs=VERBS)
    path = "/apis/kueue.x-k8s.io/v1beta1/namespaces/ml/workloads"
    emulator.call("POST", path, {
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
        "metadata": {"name": "job-train-1a2b3", "namespace": "ml",
                     "labels": {"kueue.x-k8s.io/job-uid": "job-uid"}},
        "spec": {"active": True}}, content_type=JSON)
    kube = handler_memo(emulator.write_kubeconfig(tmp_path / "kubeconfig")).state.kube
    found = kube.workload_of("ml", "job-uid")
    assert found is not None and found["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    kube.merge_patch(workload_path(found), active_patch(found, suspend=True))  # as a pass does
    assert emulator.call("GET", f"{path}/job-train-1a2b3")["spec"]["active"] is False


def policy_events(emu: Emulator) -> list[dict]:
    return [e for e in emu.items("/api/v1/namespaces/ml/events")
            if e.get("reason") == "PolicyUpdated"]


def peak_in_configmap(emu: Emulator, name: str) -> str:
    cm = emu.call("GET", f"{CM_PATH}/{name}-throttle")
    return yaml.safe_load(cm["data"]["policy.yaml"])["targets"]["cpu"]["peak"]


def test_killed_mid_edit_the_next_pass_finishes_it(
        emulator: Emulator, operator_process: OperatorProcess) -> None:
    """SIGKILL while an edit's status write hangs (its ConfigMap patched, the status not
    yet saying so): the restarted operator's pass writes the status, makes no second
    ConfigMap or Job, and posts no event for the status write that did not happen."""
    operator_process.start()
    emulator.call("POST", TJ_PATH, make_tj("edit"), content_type=JSON)
    created_once(emulator, "edit")
    hang = Fault("PATCH", r"/throttledjobs/edit/status$", status=None, delay=20)
    emulator.handler.faults.append(hang)
    emulator.call("PATCH", f"{TJ_PATH}/edit", {"spec": {"throttle": {"targets": {
        "cpu": {"peak": "700m"}}}}})
    wait_for(lambda: hang.hits == 1, TIMEOUT, what="the edit's status write to hang")
    assert peak_in_configmap(emulator, "edit") == "700m"
    operator_process.kill()
    operator_process.start()
    wait_for(lambda: status(emulator, "edit").get("observedGeneration") == 2, TIMEOUT,
             what="observedGeneration 2")
    assert cond(emulator, "edit", "PolicyApplied")["status"] == "True"
    assert len(jobs_of(emulator, "edit")) == 1 and not policy_events(emulator)
    assert_valid_status(emulator, "edit")


def test_an_edit_whose_status_write_meets_conflicts_is_written_once(
        emulator: Emulator, operator_process: OperatorProcess) -> None:
    """Two 409s on the edit's status write: read again and written, one event."""
    operator_process.start()
    emulator.call("POST", TJ_PATH, make_tj("clash"), content_type=JSON)
    created_once(emulator, "clash")
    conflict = Fault("PATCH", r"/throttledjobs/clash/status$", status=409, times=2)
    emulator.handler.faults.append(conflict)
    emulator.call("PATCH", f"{TJ_PATH}/clash", {"spec": {"throttle": {"targets": {
        "cpu": {"peak": "700m"}}}}})
    wait_for(lambda: len(policy_events(emulator)) == 1, TIMEOUT, what="a PolicyUpdated event")
    assert conflict.hits == 2 and peak_in_configmap(emulator, "clash") == "700m"
    assert cond(emulator, "clash", "PolicyApplied")["status"] == "True"
    assert status(emulator, "clash")["observedGeneration"] == 2
