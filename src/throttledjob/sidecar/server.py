"""One HTTP port: GET /metrics (Prometheus text), /healthz, /readyz and /status (JSON);
in a pod also GET /prestop, the workload containers' preStop hook (the kubelet calls it
before it sends them SIGTERM): throttling ends before the answer.

A stdlib ThreadingHTTPServer on a daemon thread (the bounded one of serving.py, which the
node agent's /metrics uses too): small, no framework, and a slow scraper cannot stall the
control loop (it only reads the latest snapshot).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from throttledjob.serving import CONNECTION_TIMEOUT_SECONDS, BoundedHTTPServer

from .metrics import make_registry
from .snapshot import SnapshotHolder, status_document

# The loop is dead (not just slow) when no cycle ran for this many intervals.
STALE_INTERVALS = 5.0


class MetricsServer:
    def __init__(self, holder: SnapshotHolder, host: str = "127.0.0.1", port: int = 9400,
                 interval_seconds: float = 1.0) -> None:
        self.holder = holder
        self.interval_seconds = interval_seconds
        self.registry = make_registry(holder)
        self.ready = False
        # Set in a pod: stands the agent down (pod.py); None: /prestop is not served.
        self.on_prestop: Callable[[], None] | None = None
        server = self

        class Handler(BaseHTTPRequestHandler):
            timeout = CONNECTION_TIMEOUT_SECONDS  # per socket operation

            def do_GET(self) -> None:
                server._handle(self)

            def log_message(self, format: str, *args: object) -> None:
                pass  # one line per scrape would drown the sidecar's own log

        self.httpd = BoundedHTTPServer((host, port), Handler)
        self._thread = threading.Thread(target=self.httpd.serve_forever,
                                        name="throttledjob-http", daemon=True)

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        path = req.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(req, 200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            ok, why = self._alive()
            self._send(req, 200 if ok else 503, why.encode())
        elif path == "/readyz":
            # Ready once a first cycle measured the workload (and the policy loaded).
            ok = self.ready and self.holder.get() is not None
            self._send(req, 200 if ok else 503, b"ok\n" if ok else b"not ready\n")
        elif path == "/status":
            snap = self.holder.get()
            if snap is None:
                self._send(req, 503, b'{"error": "no control cycle yet"}\n', "application/json")
            else:
                body = json.dumps(status_document(snap), indent=1).encode() + b"\n"
                self._send(req, 200, body, "application/json")
        elif path == "/prestop" and self.on_prestop is not None:
            self.on_prestop()
            self._send(req, 200, b"throttling ended: the pod is terminating\n")
        else:
            self._send(req, 404, b"not found: try /metrics, /healthz, /readyz, /status\n")

    def _alive(self) -> tuple[bool, str]:
        snap = self.holder.get()
        if snap is None:
            return True, "ok (starting)\n"
        age = time.time() - snap.time
        if age > STALE_INTERVALS * self.interval_seconds + 2.0:
            return False, f"control loop stalled: last cycle {age:.0f}s ago\n"
        return True, "ok\n"

    @staticmethod
    def _send(req: BaseHTTPRequestHandler, code: int, body: bytes,
              content_type: str = "text/plain; charset=utf-8") -> None:
        req.send_response(code)
        req.send_header("Content-Type", content_type)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)
