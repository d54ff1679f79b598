"""The status poller: which reads are due, and that a slow sidecar delays only its own
ThrottledJob. Real sidecar servers on 127.0.0.1 (one answers, one dribbles its answer as a
slow-loris would); the API is a small in-memory stand-in, since only the timing of the
status writes is under test here."""

from __future__ import annotations

import copy
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import wait_for
from throttledjob.operator.crd import SIDECAR_CONTAINER
from throttledjob.operator.poller import OperatorState, due, poll, read_sidecars, resync_from_job
from throttledjob.operator.settings import OperatorSettings
from throttledjob.operator.sidecar_status import HttpStatusReader

from .conftest import FakeSidecar

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
    """The three calls the poller makes, on ThrottledJobs and pods held in dicts."""

    def __init__(self) -> None:
        self.tjs: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[str, list[dict[str, Any]]] = {}
        self.lock = threading.Lock()

    def get(self, path: str) -> dict[str, Any] | None:
        return None

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.pods.get(selector.split("=", 1)[1], []))

    def update_status(self, namespace: str, name: str, mutate: Any) -> Any:
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
