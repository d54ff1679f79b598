"""Plain HTTP for the tests: a free port, a GET that never raises."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body) of a GET; (0, error) when nothing answers yet."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


def get_json(url: str) -> dict | None:
    code, body = get(url)
    return json.loads(body) if code == 200 else None
