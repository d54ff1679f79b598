"""Fixtures for the operator: schema validators, the kmock emulator, a real operator.

The emulator plays only what a real API server will not do on demand: 429s, 5xxs, lost
answers, slow answers and watch errors (test_faults.py). Everything else runs against a
real kube-apiserver (tests/cluster/). The emulator runs in a thread of the test process
(its own event loop); the operator runs as a real `throttledjob operator` process
pointed at it with a kubeconfig, exactly as a user starts it, or, where kopf's watch and
retries add nothing, a handler is called directly with a memo (`handler_memo`).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from conftest import ROOT, VENV_BIN, wait_for  # noqa: F401  (re-exported)
from throttledjob.operator import crd
from throttledjob.operator.children import LABEL_NAME
from throttledjob.operator.status import condition

K8S_VERSIONS = ("1.30", kubernetes_validate.latest_version())
NAMESPACE = "ml"


# --- validation --------------------------------------------------------------------------

def k8s_validate(obj: dict[str, Any]) -> None:
    """Strict validation against the official schemas of Kubernetes 1.30 and the newest."""
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(copy.deepcopy(obj), version, strict=True)
        except kubernetes_validate.ValidationError as e:
            raise AssertionError(f"{obj.get('kind')} invalid for Kubernetes {version}: "
                                 f"{e.message} at {list(e.path)}") from None


def strict_schema(schema: Any) -> Any:
    """The CRD schema as the API server applies it with kubectl's strict field validation:
    unknown fields are refused (additionalProperties false) except where preserved.
    `nullable` becomes a JSON-schema type union."""
    if isinstance(schema, list):
        return [strict_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict_schema(v) for k, v in schema.items()
           if not k.startswith("x-kubernetes-") and k != "nullable"}
    if schema.get("nullable"):
        out["type"] = [schema["type"], "null"]
    if ("properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    if schema.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    return out


CR_SCHEMA = strict_schema(crd.openapi_schema())
CR_VALIDATOR = jsonschema.Draft7Validator(CR_SCHEMA, format_checker=jsonschema.FormatChecker())


def cr_errors(obj: dict[str, Any]) -> list[str]:
    """Schema errors of a custom resource, as 'path: message' strings."""
    return [f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
            for e in CR_VALIDATOR.iter_errors(obj)]


# --- manifests ---------------------------------------------------------------------------

def make_tj(name: str = "train", *, throttle: dict[str, Any] | None = None,
            parameters: dict[str, Any] | None = None, **pod: Any) -> dict[str, Any]:
    """A small valid ThrottledJob; keyword arguments override pod spec fields."""
    container = {"name": "trainer", "image": "python:3.11-slim",
                 "command": ["python", "train.py"],
                 "resources": {"limits": {"cpu": "2", "memory": "1Gi"}},
                 "securityContext": {"allowPrivilegeEscalation": False,
                                     "capabilities": {"drop": ["ALL"]}}}
    pod_spec = {"restartPolicy": "Never", "containers": [container],
                "securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                                    "seccompProfile": {"type": "RuntimeDefault"}}, **pod}
    spec: dict[str, Any] = {
        "jobTemplate": {"metadata": {"labels": {"team": "vision"}},
                        "spec": {"backoffLimit": 0, "template": {"spec": pod_spec}}},
        "throttle": throttle if throttle is not None else {
            "targets": {"cpu": {"peak": "1500m"}}, "maxSlowdown": 1.25,
            "mode": "Adaptive", "enforcement": "Cooperative", "intervalSeconds": 1},
    }
    if parameters is not None:
        spec["parameters"] = parameters
    return {"apiVersion": crd.API_VERSION, "kind": crd.KIND,
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


# --- the emulator ------------------------------------------------------------------------

RESOURCES = {
    f"{crd.GROUP}/{crd.VERSION}/{crd.PLURAL}": dict(
        kind=crd.KIND, namespaced=True, singular=crd.SINGULAR, shortnames=crd.SHORT_NAMES,
        subresources=["status"]),
    "batch/v1/jobs": dict(kind="Job", namespaced=True, singular="job",
                          subresources=["status"]),
    "v1/configmaps": dict(kind="ConfigMap", namespaced=True, singular="configmap"),
    "v1/pods": dict(kind="Pod", namespaced=True, singular="pod", subresources=["status"]),
    "v1/events": dict(kind="Event", namespaced=True, singular="event"),
    # kopf waits for these after login (docs/testing.md).
    "v1/namespaces": dict(kind="Namespace", namespaced=False, singular="namespace"),
    "apiextensions.k8s.io/v1/customresourcedefinitions": dict(
        kind="CustomResourceDefinition", namespaced=False,
        singular="customresourcedefinition"),
}
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def _make_emulator_class() -> type:
    import kmock

    class StampingEmulator(kmock.KubernetesEmulator):
        """kmock plus what a real API server stamps and enforces, and kopf relies on:
        uid, resourceVersion, generation, creationTimestamp, generateName (kopf's
        events), a resourceVersion precondition on merge patches (409), and
        owner-reference garbage collection."""

        def __attrs_post_init__(self) -> None:
            super().__attrs_post_init__()
            self.counter = itertools.count(1000)
            self.mutations = asyncio.Lock()
            self.sent: list[tuple[str, str, Any]] = []  # (method, path, body) of writes
            self.faults: list[Fault] = []

        async def _handle(self, request: Any) -> Any:
            # kmock keeps every request and, to route a new one, scans them all: O(n) per
            # request, O(n^2) over a run, which made the emulator (not the operator) the
            # bottleneck of the load test. The tests keep their own record (self.sent).
            if len(self._requests) > 200:
                del self._requests[:-50]
            fault = next((f for f in self.faults if f.matches(request)), None)
            if fault is None:
                return await self._handle_stamped(request)
            fault.hits += 1
            if not fault.after_commit:
                await asyncio.sleep(fault.delay)
                raise fault.error()
            response = await self._handle_stamped(request)  # done, but the answer is lost
            await asyncio.sleep(fault.delay)
            if fault.status is None:
                return response  # late: the client has given up by now
            raise fault.error()

        async def _handle_stamped(self, request: Any) -> Any:
            act = kmock.action
            if request.resource is None or request.action not in (
                    act.CREATE, act.UPDATE, act.DELETE):
                return await super()._handle(request)
            async with self.mutations:
                self.sent.append((request.action.value, str(request.url.path),
                                  copy.deepcopy(request.data)))
                key = (request.resource, request.namespace, request.name)
                current = self._objects[key] if request.name and key in self._objects else None
                alive = current is not None and not current.deleted
                if request.action == act.CREATE and isinstance(request.data, dict):
                    meta = request.data.setdefault("metadata", {})
                    if not meta.get("name") and meta.get("generateName"):
                        meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                    meta.update(uid=str(uuid.uuid4()), resourceVersion=str(next(self.counter)),
                                generation=1, creationTimestamp=_now())
                elif request.action == act.UPDATE and alive:
                    rv = str(next(self.counter))
                    old_meta = current.raw.get("metadata", {})
                    gen = old_meta.get("generation", 1)
                    if isinstance(request.data, dict):
                        wanted = (request.data.get("metadata") or {}).get("resourceVersion")
                        if wanted and wanted != old_meta.get("resourceVersion"):
                            raise kmock.KubernetesError(status=409, reason="Conflict",
                                                        message="the object has been modified")
                        if "spec" in request.data and request.subresource is None:
                            gen += 1
                        request.data.setdefault("metadata", {}).update(
                            resourceVersion=rv, generation=gen)
                    elif isinstance(request.data, list):
                        if any(str(op.get("path", "")).startswith("/spec")
                               for op in request.data):
                            request.data.append({"op": "add", "path": "/metadata/generation",
                                                 "value": gen + 1})
                        request.data.append({"op": "add", "path": "/metadata/resourceVersion",
                                             "value": rv})
                response = await super()._handle(request)
                if request.action == act.DELETE and alive and current.deleted:
                    await self._collect_garbage(old_uid=current.last.raw["metadata"]["uid"])
                return response

        async def _serve_fetch(self, request: Any) -> Any:
            """kmock scans every object on each GET; a keyed lookup keeps the 1,000-object
            load test about the operator, not the emulator."""
            key = (request.resource, request.namespace, request.name)
            async with self._lock:
                obj = self._objects[key] if key in self._objects else None  # noqa: SIM401 (no .get)
            if obj is None or obj.deleted:
                raise kmock.KubernetesObjectNotFoundError()
            return obj.raw

        async def _collect_garbage(self, old_uid: str) -> None:
            """What the garbage collector does: delete the dependants of a deleted owner."""
            for (resource, _ns, _name), obj in list(self._objects.items()):
                if obj.deleted:
                    continue
                refs = obj.raw.get("metadata", {}).get("ownerReferences") or []
                if any(r.get("uid") == old_uid for r in refs):
                    raw = obj.raw
                    obj.delete()
                    await self._buses[resource].put({"type": "DELETED", "object": raw})

    return StampingEmulator


@dataclasses.dataclass
class Fault:
    """An API failure the emulator plays: `times` requests whose method is `method` and
    whose path matches `path` (a regex) fail with `status` after `delay` seconds. With
    `after_commit` the server does the work first and only the answer is lost (the case
    that duplicates objects in a careless client); status None then means a late answer
    (a client timeout when `delay` exceeds it). Only requests whose User-Agent contains
    `agent` count: by default the operator's own client, not kopf's or the test's."""

    method: str
    path: str
    status: int | None = 500
    times: int = 1
    delay: float = 0.0
    after_commit: bool = False
    retry_after: int | None = None
    agent: str = "OpenAPI-Generator"
    hits: int = 0

    def matches(self, request: Any) -> bool:
        return (self.hits < self.times and str(request.method.value) == self.method
                and self.agent in (request.headers or {}).get("User-Agent", "")
                and re.search(self.path, str(request.url.path)) is not None)

    def error(self) -> Exception:
        import kmock

        details = {"retryAfterSeconds": self.retry_after} if self.retry_after else {}
        return kmock.KubernetesError(status=self.status or 504, reason="Injected",
                                     message=f"injected fault {self.status}",
                                     details=details)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Emulator:
    """The emulator in a background thread, and a tiny JSON client for the tests."""

    def __init__(self) -> None:
        self.url = ""
        self.handler: Any = None
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="kmock")

    def start(self) -> Emulator:
        self._thread.start()
        if not self._ready.wait(30) or self._error:
            raise RuntimeError(f"kmock did not start: {self._error!r}")
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as e:  # surfaced by start()
            self._error = e
            self._ready.set()

    async def _serve(self) -> None:
        import kmock

        self._stop = asyncio.Event()
        async with _make_emulator_class()() as handler, kmock.Server(handler) as server:
            for key, info in RESOURCES.items():
                handler.resources[key] = {**info, "verbs": VERBS}
            self.handler = handler
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
            "users": [{"name": "kmock", "user": {"token": "test-token"}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}],
        }))
        return path

    def watch_error(self, plural: str, code: int = 410) -> None:
        """Send an ERROR event (410 Gone: "resource version too old") down every watch of
        the resource named `plural`, as an API server does when a watch falls behind."""
        event = {"type": "ERROR", "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "code": code, "reason": "Expired" if code == 410 else "InternalError",
            "message": "too old resource version"}}
        buses = [bus for resource, bus in list(self.handler._buses.items())
                 if getattr(resource, "plural", None) == plural]
        assert buses, f"nobody watches {plural}"

        async def put() -> None:
            for bus in buses:
                await bus.put(event)

        asyncio.run_coroutine_threadsafe(put(), self._loop).result(10)

    # --- a JSON client -------------------------------------------------------------------

    def call(self, method: str, path: str, body: Any = None,
             content_type: str = "application/merge-patch+json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": content_type,
                                              "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def items(self, path: str) -> list[dict[str, Any]]:
        return (self.call("GET", path) or {}).get("items") or []

    def sent(self, method: str, fragment: str) -> list[Any]:
        """Bodies of the writes (CREATE, UPDATE, DELETE) whose path contains `fragment`."""
        return [body for m, path, body in list(self.handler.sent)
                if m == method and fragment in path]


TJ_PATH = f"/apis/{crd.GROUP}/{crd.VERSION}/namespaces/{NAMESPACE}/{crd.PLURAL}"
JOBS_PATH = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
CM_PATH = f"/api/v1/namespaces/{NAMESPACE}/configmaps"


# --- reading a ThrottledJob's world from the emulator ----------------------------------------

TIMEOUT = 30.0


def tj_of(emu: Emulator, name: str) -> dict[str, Any]:
    return emu.call("GET", f"{TJ_PATH}/{name}") or {}


def status(emu: Emulator, name: str) -> dict[str, Any]:
    return tj_of(emu, name).get("status") or {}


def cond(emu: Emulator, name: str, type_: str) -> dict[str, Any]:
    return condition(status(emu, name), type_) or {}


def jobs_of(emu: Emulator, name: str) -> list[dict[str, Any]]:
    return [j for j in emu.items(JOBS_PATH)
            if j["metadata"].get("labels", {}).get(LABEL_NAME) == name]


def assert_valid_status(emu: Emulator, name: str) -> None:
    errors = cr_errors(tj_of(emu, name))
    assert not errors, errors



@pytest.fixture
def emulator() -> Iterator[Emulator]:
    emu = Emulator().start()
    yield emu
    emu.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OperatorProcess:
    """`throttledjob operator --standalone` as a child process; restartable. Talks to
    whatever `kubeconfig` names: the emulator, or the real API server as some identity."""

    def __init__(self, kubeconfig: Path, workdir: Path, scope: tuple[str, ...] = ("-A",)) -> None:
        self.workdir = workdir
        # Test-sized defaults; a test may change them before start().
        self.env = {"THROTTLEDJOB_RESYNC_INTERVAL": "2", "THROTTLEDJOB_API_TIMEOUT": "5"}
        self.verbose = True
        self.kubeconfig = kubeconfig
        self.scope = scope
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.port = 0

    def start(self) -> OperatorProcess:
        self.starts += 1
        self.port = _free_port()
        log = open(self.workdir / f"operator-{self.starts}.log", "wb")  # noqa: SIM115
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "HOME": str(self.workdir),
               "KUBERNETES_SERVICE_HOST": "", **self.env}
        self.proc = subprocess.Popen(
            [str(VENV_BIN / "throttledjob"), "operator", "--standalone", *self.scope,
             *(["--verbose"] if self.verbose else []), "--status-interval", "0.5", "--liveness",
             f"http://127.0.0.1:{self.port}/healthz"],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.workdir)
        log.close()
        wait_for(self._live, timeout=30, what=f"operator liveness (see {self.log_text()})")
        return self

    def _live(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            pytest.fail(f"operator exited with {self.proc.returncode}:\n{self.log_text()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1):
                return True
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, as a crashed or evicted operator."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def full_log(self) -> str:
        return "".join(p.read_text(errors="replace")
                       for p in sorted(self.workdir.glob("operator-*.log")))

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-6000:]
                         for p in sorted(self.workdir.glob("operator-*.log")))


@pytest.fixture
def operator_process(emulator: Emulator, tmp_path: Path,
                     request: pytest.FixtureRequest) -> Iterator[OperatorProcess]:
    op = OperatorProcess(emulator.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path)
    yield op
    op.stop()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        sys.stderr.write(f"--- operator log ---\n{op.log_text()}\n")


def handler_memo(kubeconfig: Path, **settings: Any) -> Any:
    """kopf's memo as the startup handler leaves it, for calling handlers directly: the
    OperatorState of test `settings` and a client logged in with `kubeconfig`."""
    import kopf
    import kubernetes

    from throttledjob.operator.kube import Kube
    from throttledjob.operator.poller import OperatorState
    from throttledjob.operator.settings import OperatorSettings
    from throttledjob.operator.sidecar_status import HttpStatusReader

    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(str(kubeconfig), client_configuration=config)
    ours = OperatorSettings(**settings)
    kube = Kube(kubernetes.client.ApiClient(config), timeout_seconds=ours.api_timeout_seconds)
    return kopf.Memo(state=OperatorState(ours, kube,
                                         HttpStatusReader(ours.status_timeout_seconds)))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    report = yield
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report


class FakeSidecar:
    """A real HTTP server answering GET /status with `self.doc`."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1") -> None:
        self.doc: dict[str, Any] = {}
        self.hits = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.hits += 1
                body = json.dumps(outer.doc).encode()
                self.send_response(200 if self.path == "/status" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
