"""The few Kubernetes API calls the operator makes besides kopf's own, as plain JSON.

One pool of keep-alive connections (urllib3) to the server that login.py found, signed as
kopf's watches are; the bodies stay plain dicts, so what children.py and status.py
return is exactly what is sent, with no model round trip.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple
from urllib.parse import quote, urlencode

import kopf
import urllib3

from throttledjob import __version__

from .api_names import GROUP, PLURAL, VERSION
from .conditions import as_stored
from .kueue import WORKLOAD_VERSIONS, workload_query, workloads_path

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
# A read-modify-write of the status retries this often when someone else wrote first.
STATUS_WRITE_ATTEMPTS = 8
# Answers worth another try: throttled, or the server (or a proxy) failed. Status 0 is
# ours: no answer at all (timeout, connection refused or reset).
TRANSIENT = frozenset({0, 429, 500, 502, 503, 504})
# Who the API server's audit log and metrics name for our calls (kopf names its own).
USER_AGENT = f"throttledjob-operator/{__version__}"
log = logging.getLogger(__name__)


class ApiError(RuntimeError):
    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status
        self.retry_after = retry_after

    @property
    def transient(self) -> bool:
        return self.status in TRANSIENT


def backoff_seconds(attempt: int, base: float = 0.2, cap: float = 5.0,
                    retry_after: float | None = None) -> float:
    """Exponential backoff with full jitter (attempt 0, 1, ...), at least Retry-After."""
    delay = random.uniform(0, min(cap, base * 2 ** attempt))
    return max(delay, min(retry_after or 0.0, 60.0))


class _Session(NamedTuple):
    """Where and as whom the calls go: swapped whole when the login is renewed."""

    server: str
    headers: dict[str, str]
    pool: urllib3.PoolManager


class Kube:
    """JSON in, JSON out, over one thread-safe pool of up to `connections` keep-alive
    connections (one per thread that calls: beyond it, each call would open anew).
    `login` gives the server and credentials, again after a 401 (a service account's
    token is rotated while the operator runs)."""

    def __init__(self, login: Callable[[], kopf.ConnectionInfo], connections: int = 10,
                 timeout_seconds: float = 10.0, attempts: int = 5) -> None:
        self.login = login
        self.connections = connections
        self.timeout_seconds = timeout_seconds
        self.attempts = attempts
        self._lock = threading.Lock()
        self._session = self._logged_in()

    def _logged_in(self) -> _Session:
        info = self.login()
        tls = {"ssl_context": info.as_ssl_context()} if info.server.startswith("https") else {}
        pool = urllib3.PoolManager(num_pools=1, maxsize=self.connections, retries=False,
                                   **tls)
        return _Session(info.server.rstrip("/"), info.as_http_headers(), pool)

    def _log_in_again(self, stale: _Session) -> None:
        """After a 401 on `stale`: log in anew, once for all the threads that met it."""
        with self._lock:
            if self._session is not stale:
                return  # another thread has already
            try:
                self._session = self._logged_in()
            except Exception as e:  # the login's own errors, whatever the source
                raise ApiError(401, f"logging in again failed: {e}") from e
            stale.pool.clear()

    @property
    def headers(self) -> dict[str, str]:
        return self._session.headers

    def request(self, method: str, path: str, body: Any = None,
                query: Mapping[str, str] | None = None,
                content_type: str = "application/json") -> dict[str, Any]:
        """One API call, retried with backoff on transient failures (429, 5xx, timeouts),
        and once more logged in anew after a 401.

        Every call the operator makes is safe to repeat: a create that reached the server
        before its answer was lost comes back as 409 (handled by `create`), a merge patch
        is idempotent, and a status write carries a resourceVersion precondition."""
        if query:
            path = f"{path}?{urlencode(query)}"
        relogged = False
        attempt = 0
        while True:
            session = self._session
            try:
                return self._request_once(session, method, path, body, content_type)
            except ApiError as e:
                if e.status == 401 and not relogged:
                    relogged = True
                    self._log_in_again(session)
                    continue
                if not e.transient or attempt == self.attempts - 1:
                    raise
                delay = backoff_seconds(attempt, retry_after=e.retry_after)
                log.warning("%s %s failed (%s); retry %d in %.2fs", method, path, e,
                            attempt + 1, delay)
                attempt += 1
                time.sleep(delay)

    def _request_once(self, session: _Session, method: str, path: str, body: Any,
                      content_type: str) -> dict[str, Any]:
        headers = {**session.headers, "Accept": "application/json",
                   "Content-Type": content_type, "User-Agent": USER_AGENT}
        try:
            resp = session.pool.request(
                method, session.server + path, headers=headers,
                body=None if body is None else json.dumps(body).encode(),
                timeout=urllib3.Timeout(total=self.timeout_seconds))
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise ApiError(0, f"no answer from the API server: {type(e).__name__}: "
                              f"{str(e)[:200]}") from e
        data = resp.data
        if resp.status >= 400:
            retry_after = None
            try:
                doc = json.loads(data)
                message = doc.get("message", "")
                retry_after = (doc.get("details") or {}).get("retryAfterSeconds")
            except (ValueError, AttributeError):
                message = data[:200].decode(errors="replace")
            header = resp.headers.get("Retry-After")
            with contextlib.suppress(ValueError):  # an HTTP date: keep the body's hint
                retry_after = float(header) if header else retry_after
            raise ApiError(resp.status, message,
                           float(retry_after) if retry_after is not None else None)
        return json.loads(data) if data else {}

    # --- paths ---------------------------------------------------------------------------

    @staticmethod
    def tj_path(namespace: str, name: str) -> str:
        return (f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/{PLURAL}/"
                f"{quote(name)}")

    # --- calls ---------------------------------------------------------------------------

    def create(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        """Create `obj`; None when an object of that name already exists (409)."""
        try:
            return self.request("POST", path, obj)
        except ApiError as e:
            if e.status == 409:
                return None
            raise

    def get(self, path: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("PATCH", path, patch, content_type=MERGE_PATCH)

    def resize_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """Patch a running pod's resources (the `pods/resize` subresource, Kubernetes 1.33+;
        containers merged by name)."""
        return self.request("PATCH", f"/api/v1/namespaces/{quote(namespace)}/pods/"
                                     f"{quote(name)}/resize", patch,
                            content_type=STRATEGIC_PATCH)

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self.list(f"/api/v1/namespaces/{quote(namespace)}/pods", selector)

    def list(self, path: str, selector: str) -> list[dict[str, Any]]:
        """The items of a collection that match a label selector."""
        doc = self.request("GET", path, query={"labelSelector": selector})
        return list(doc.get("items") or [])

    def workload_of(self, namespace: str, job_uid: str) -> dict[str, Any] | None:
        """Kueue's Workload of a Job (kueue.py), at the first version Kueue serves, with
        that apiVersion; or None: not made yet, or no Kueue."""
        for version in WORKLOAD_VERSIONS:
            try:
                doc = self.request("GET", workloads_path(namespace, version),
                                   query=workload_query(job_uid))
            except ApiError as e:
                if e.status == 404:  # not this version (an older Kueue), or no Kueue
                    continue
                raise
            items = doc.get("items") or []
            return {**items[0], "apiVersion": f"kueue.x-k8s.io/{version}"} if items else None
        return None

    def update_status(self, namespace: str, name: str,
                      mutate: Callable[[dict[str, Any], Mapping[str, Any]], dict[str, Any]],
                      read: Mapping[str, Any] | None = None,
                      ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]] | None:
        """Read-modify-write of a ThrottledJob's status, guarded by resourceVersion:
        `mutate(status, tj)` makes the new status from a copy of the old one and the
        ThrottledJob as read: `read` where the caller has just read it (a conflict reads
        it anew), else a GET.

        Several writers (the create handler, the Job watcher, the sidecar timer) own
        different conditions of one list, and a merge patch replaces a list whole: the
        resourceVersion precondition turns a lost update into a 409 and a retry.
        Returns (object, old status, new status), or None when the object is gone.

        It reads with a GET, not from the watch's copy: under a burst the watch lags
        our own writes, and a stale copy cost a 409, the GET and the write again (5.3
        status patches per ThrottledJob in the burst against 2.2, burst/floor 1.59-1.88x
        against 1.44x; docs/dev/benchmarks-history.md, "Load")."""
        path = self.tj_path(namespace, name)
        for attempt in range(STATUS_WRITE_ATTEMPTS):
            tj = dict(read) if read is not None and attempt == 0 else self.get(path)
            if tj is None:
                return None
            old = dict(tj.get("status") or {})
            new = mutate(dict(old), tj)
            if as_stored(new) == as_stored(old):
                return tj, old, new
            # Keys the new status drops must be nulled: a merge patch only adds.
            status = {**{k: None for k in old if k not in new}, **new}
            try:
                self.merge_patch(f"{path}/status", {
                    "metadata": {"resourceVersion": tj["metadata"].get("resourceVersion")},
                    "status": status})
            except ApiError as e:
                if e.status == 409:
                    continue
                if e.status == 404:  # deleted since the read
                    return None
                raise
            return tj, old, new
        raise ApiError(409, f"status of {namespace}/{name} kept changing under us")
