"""The kmock emulator: plays only what a real API server will not do on demand: 429s,
5xxs, lost answers, slow answers and watch errors (tests/operator/test_faults.py).
Everything else runs against a real kube-apiserver (tests/cluster/). It runs in a thread
of the test process (its own event loop); the operator is pointed at it with a
kubeconfig. Below it, what the tests read of a ThrottledJob's world from it.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import itertools
import json
import re
import threading
import urllib.error
import urllib.request
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from testing.manifests import NAMESPACE
from testing.validation import cr_errors
from throttledjob.operator import api_names
from throttledjob.operator.children import LABEL_NAME
from throttledjob.operator.conditions import condition
from throttledjob.operator.kube import USER_AGENT

RESOURCES = {
    f"{api_names.GROUP}/{api_names.VERSION}/{api_names.PLURAL}": dict(
        kind=api_names.KIND, namespaced=True, singular=api_names.SINGULAR,
        shortnames=api_names.SHORT_NAMES,
        subresources=["status"]),
    "batch/v1/jobs": dict(kind="Job", namespaced=True, singular="job",
                          subresources=["status"]),
    "v1/configmaps": dict(kind="ConfigMap", namespaced=True, singular="configmap"),
    "v1/pods": dict(kind="Pod", namespaced=True, singular="pod", subresources=["status"]),
    "v1/events": dict(kind="Event", namespaced=True, singular="event"),
    # kopf waits for these after login (docs/dev/testing.md).
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
    `agent` count: by default the operator's own client, not kopf's or the test's; with
    `authorization`, only those signed so (an expired token)."""

    method: str
    path: str
    status: int | None = 500
    times: int = 1
    delay: float = 0.0
    after_commit: bool = False
    retry_after: int | None = None
    agent: str = USER_AGENT
    authorization: str | None = None  # only requests that carry this Authorization
    hits: int = 0

    def matches(self, request: Any) -> bool:
        headers = request.headers or {}
        return (self.hits < self.times and str(request.method.value) == self.method
                and self.agent in headers.get("User-Agent", "")
                and self.authorization in (None, headers.get("Authorization"))
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


TJ_PATH = f"/apis/{api_names.GROUP}/{api_names.VERSION}/namespaces/{NAMESPACE}/{api_names.PLURAL}"
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
