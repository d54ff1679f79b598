"""Reading a sidecar's GET /status, behind a small interface.

The operator only needs `read(host, port) -> dict`; tests serve a real HTTP server on
127.0.0.1 rather than mocking this, so the HTTP path itself is tested.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Protocol

from throttledjob.contracts.status import StatusDocument, parse_status

# A /status document is a few hundred bytes; refuse anything absurd before parsing it.
MAX_STATUS_BYTES = 64 * 1024


class StatusReadError(RuntimeError):
    """The sidecar did not answer with a usable /status document."""


class StatusReader(Protocol):
    def read(self, host: str, port: int) -> StatusDocument: ...


class HttpStatusReader:
    """GET http://HOST:PORT/status within a total deadline (pods die, or dribble their
    answer: a per-read timeout let 16 bytes every 0.5 s hold one read for 8 s, and 64 KiB
    for a day)."""

    def __init__(self, timeout_seconds: float = 2.0) -> None:
        self.timeout_seconds = timeout_seconds

    def read(self, host: str, port: int) -> StatusDocument:
        # IPv6 pod IPs need brackets in a URL.
        netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        url = f"http://{netloc}/status"
        try:
            raw = self._fetch(host, port, netloc)
        except (OSError, ValueError) as e:
            raise StatusReadError(f"{url}: {e}") from None
        head, _, body = raw.partition(b"\r\n\r\n")
        if len(body) > MAX_STATUS_BYTES:
            raise StatusReadError(f"{url}: answer larger than {MAX_STATUS_BYTES} bytes")
        status_line = head.split(b"\r\n", 1)[0].split()
        if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/"):
            raise StatusReadError(f"{url}: not an HTTP answer")
        if status_line[1] != b"200":
            raise StatusReadError(f"{url}: HTTP {status_line[1].decode(errors='replace')}")
        try:
            doc = json.loads(body)
        except ValueError:
            raise StatusReadError(f"{url}: not JSON") from None
        try:
            return parse_status(doc)
        except ValueError as e:
            raise StatusReadError(f"{url}: {e}") from None

    def _fetch(self, host: str, port: int, netloc: str) -> bytes:
        """The whole answer of an HTTP/1.0 GET (the server closes when done), or an
        error once the deadline or the size limit is passed."""
        deadline = time.monotonic() + self.timeout_seconds
        with socket.create_connection((host, port), timeout=self.timeout_seconds) as sock:
            sock.sendall(f"GET /status HTTP/1.0\r\nHost: {netloc}\r\n"
                         "Accept: application/json\r\n\r\n".encode())
            data = bytearray()
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"timed out: no whole answer within "
                                       f"{self.timeout_seconds:g}s")
                sock.settimeout(remaining)
                chunk = sock.recv(16384)
                if not chunk:
                    return bytes(data)
                data += chunk
                if len(data) > MAX_STATUS_BYTES + 4096:  # the document plus its headers
                    raise ValueError(f"answer larger than {MAX_STATUS_BYTES} bytes")
