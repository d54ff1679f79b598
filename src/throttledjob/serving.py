"""The bounded HTTP server that the pod's sidecar (sidecar/server.py) and the node agent
(node/metrics.py) serve their ports with: a stdlib ThreadingHTTPServer, a thread per
connection, at most MAX_CONNECTIONS of them and MAX_PER_CLIENT from one address, each
socket operation timed out (CONNECTION_TIMEOUT_SECONDS, the handlers' `timeout`).
Stdlib only.
"""

from __future__ import annotations

import collections
import threading
from http.server import ThreadingHTTPServer

# Requests served at once, and how long one connection may take to send its request:
# 1,000 half-sent requests once made 1,000 threads (+26 MB against a 128 MiB limit, and
# threads count against the pod's process limit, which the workload shares). Prometheus
# and the operator need one connection each; the kubelet (probes, a preStop call per
# workload container) a few. One client holds at most MAX_PER_CLIENT: 16 slow ones from
# one address locked the kubelet's /healthz and /prestop out.
MAX_CONNECTIONS = 24
MAX_PER_CLIENT = 8
CONNECTION_TIMEOUT_SECONDS = 5.0


class BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per request, at most `max_connections` of them: a connection over the cap
    is closed at once, before any thread exists for it."""

    daemon_threads = True
    # Pending connections the kernel holds before dropping SYNs (socketserver's 5 made
    # a burst of clients wait out 1 s retransmits).
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type,
                 max_connections: int = MAX_CONNECTIONS,
                 max_per_client: int = MAX_PER_CLIENT) -> None:
        super().__init__(address, handler)
        self._max_connections, self._max_per_client = max_connections, max_per_client
        self._per_client: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def process_request(self, request, client_address) -> None:  # type: ignore[override]
        client = _client(client_address)
        with self._lock:
            if (self._per_client.total() >= self._max_connections
                    or self._per_client[client] >= self._max_per_client):
                self.shutdown_request(request)
                return
            self._per_client[client] += 1
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(client)
            raise

    def process_request_thread(self, request, client_address) -> None:  # type: ignore[override]
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(_client(client_address))

    def _release(self, client: str) -> None:
        with self._lock:
            self._per_client[client] -= 1
            if not self._per_client[client]:
                del self._per_client[client]


def _client(address: object) -> str:
    """The address connections are counted by (a UNIX socket's: one client)."""
    return address[0] if isinstance(address, tuple) else ""
