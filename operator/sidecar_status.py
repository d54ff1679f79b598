"""Reading a sidecar's GET /status, behind a small interface.

The operator only needs `read(host, port) -> dict`; tests serve a real HTTP server on
127.0.0.1 rather than mocking this, so the HTTP path itself is tested.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Protocol

# A /status document is a few hundred bytes; refuse anything absurd before parsing it.
MAX_STATUS_BYTES = 64 * 1024


class StatusReadError(RuntimeError):
    """The sidecar did not answer with a usable /status document."""


class StatusReader(Protocol):
    def read(self, host: str, port: int) -> dict[str, Any]: ...


class HttpStatusReader:
    """GET http://HOST:PORT/status with a short timeout (pods die; the timer must not)."""

    def __init__(self, timeout_seconds: float = 2.0) -> None:
        self.timeout_seconds = timeout_seconds

    def read(self, host: str, port: int) -> dict[str, Any]:
        # IPv6 pod IPs need brackets in a URL.
        netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        url = f"http://{netloc}/status"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_seconds) as resp:
                data = resp.read(MAX_STATUS_BYTES + 1)
        except urllib.error.HTTPError as e:
            raise StatusReadError(f"{url}: HTTP {e.code}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise StatusReadError(f"{url}: {getattr(e, 'reason', e)}") from None
        if len(data) > MAX_STATUS_BYTES:
            raise StatusReadError(f"{url}: answer larger than {MAX_STATUS_BYTES} bytes")
        try:
            doc = json.loads(data)
        except ValueError:
            raise StatusReadError(f"{url}: not JSON") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("observed"), dict):
            raise StatusReadError(f"{url}: no 'observed' object in the answer")
        return doc
