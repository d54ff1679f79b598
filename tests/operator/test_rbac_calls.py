"""Least privilege, from what the operator really does: record every API call the operator
makes through a ThrottledJob's whole life against the emulator, and check that the
chart's ClusterRole grants exactly those calls (tests/chart/test_rbac.py renders it)."""

from __future__ import annotations

from ..chart.test_rbac import CRDS, NAMESPACED
from ..conftest import wait_for
from .conftest import (
    CM_PATH,
    JOBS_PATH,
    TJ_PATH,
    Emulator,
    FakeSidecar,
    OperatorProcess,
    api_call,
    make_tj,
)
from .test_e2e import jobs_of, play_pod, status

TIMEOUT = 30


def test_api_call_names_the_rbac_verb():
    assert api_call("GET", "/apis/batch/v1/namespaces/ml/jobs", True) == ("batch", "jobs",
                                                                           "watch")
    assert api_call("GET", "/api/v1/namespaces/ml/configmaps/x", False) == ("", "configmaps",
                                                                              "get")
    assert api_call("PATCH", "/apis/g.io/v1/namespaces/ml/tjs/a/status", False) == (
        "g.io", "tjs/status", "patch")
    assert api_call("GET", "/api/v1/namespaces", False) == ("", "namespaces", "list")
    assert api_call("GET", "/apis/batch/v1", False) is None  # discovery


def test_the_chart_grants_exactly_the_calls_the_operator_makes(
        emulator: Emulator, operator_process: OperatorProcess, sidecar: FakeSidecar) -> None:
    operator_process.start()
    emulator.call("POST", TJ_PATH, make_tj("train"), content_type="application/json")
    (job,) = wait_for(lambda: jobs_of(emulator, "train"), TIMEOUT, what="the Job")
    play_pod(emulator, job, sidecar.port)
    emulator.call("PATCH", f"{JOBS_PATH}/train/status",
                  {"status": {"active": 1, "startTime": "2026-01-01T00:00:00Z"}})
    wait_for(lambda: status(emulator, "train").get("observed"), TIMEOUT, what="observed")
    emulator.call("PATCH", f"{TJ_PATH}/train",
                  {"spec": {"throttle": {"targets": {"cpu": {"peak": "900m"}}}}})
    wait_for(lambda: "900m" in emulator.call("GET", f"{CM_PATH}/train-throttle")["data"][
        "policy.yaml"], TIMEOUT, what="the edit in the ConfigMap")
    # A restart: resume finds the Job and the ConfigMap already there and reads them.
    assert operator_process.stop() == 0
    operator_process.start()
    emulator.call("PATCH", f"{JOBS_PATH}/train/status", {"status": {
        "active": 0, "succeeded": 1, "completionTime": "2026-01-01T01:00:00Z",
        "conditions": [{"type": "Complete", "status": "True"}]}})
    wait_for(lambda: status(emulator, "train").get("phase") == "Succeeded", TIMEOUT,
             what="phase Succeeded")
    assert operator_process.stop() == 0

    granted = {(g, r, v) for (g, r), verbs in {**NAMESPACED, **CRDS}.items() for v in verbs}
    assert emulator.handler.calls - granted == set(), "calls the chart does not grant"
    assert granted - emulator.handler.calls == set(), "grants the operator never used"
