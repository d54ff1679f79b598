"""A stand-in for a pod's sidecar: a real HTTP server answering GET /status."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Many readers connect at once (the load benchmark's poller): the default backlog of
    # 5 drops their SYNs, which come back a second later.
    request_queue_size = 256


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

        self.server = _Server((host, port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
