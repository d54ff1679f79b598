"""HttpStatusReader against a real HTTP server on 127.0.0.1 (no mock of the HTTP path)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from throttledjob.contracts.status import parse_status
from throttledjob.operator.sidecar_status import (
    MAX_STATUS_BYTES,
    HttpStatusReader,
    StatusReadError,
)


class Server:
    """Answers GET /status with `body` and `code`, or never answers when `hang`."""

    def __init__(self) -> None:
        self.body = b"{}"
        self.code = 200
        self.hang = threading.Event()
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if outer.hang.is_set():
                    outer.release.wait(10)
                    return
                self.send_response(outer.code if self.path == "/status" else 404)
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.release.set()
    s.httpd.shutdown()
    s.httpd.server_close()


GOOD = (b'{"observed": {"cpuPeakCores": 1.4, "cpuMaxCores": 1.9, '
        b'"gpuPeakUtilizationPercent": null, "gpuPeakPowerWatts": null, '
        b'"throttleLevel": 0.3, "slowdown": 1.1}, "targetMet": true, '
        b'"budgetExhausted": false, "levers": ["pacing"], "errors": []}')


def test_reads_a_status_document(server: Server) -> None:
    server.body = GOOD
    doc = HttpStatusReader().read("127.0.0.1", server.port)
    assert doc["observed"]["cpuPeakCores"] == 1.4 and doc["targetMet"] is True


@pytest.mark.parametrize(("wanted", "read"), [
    (1.6, 1.6), (None, None), ("1.6", None), (float("nan"), None), (-1, None), (0, None),
    (True, None)])
def test_a_wanted_limit_is_a_positive_number_or_none(wanted: Any, read: float | None) -> None:
    """A sidecar is another program: what it asks the operator to resize to is checked."""
    doc = parse_status({**json.loads(GOOD), "cpuLimitWantedCores": wanted})
    assert doc["cpuLimitWantedCores"] == read


def test_what_each_container_wanted_keeps_only_non_negative_numbers_by_name() -> None:
    doc = parse_status({**json.loads(GOOD), "cpuDemandCores": {
        "train": 1.9, "logs": 0, "bad": -1, "nan": float("nan"), "text": "1", "flag": True}})
    assert doc["cpuDemandCores"] == {"train": 1.9, "logs": 0.0}
    for odd in (None, [1.0], "train=1"):
        assert parse_status({**json.loads(GOOD), "cpuDemandCores": odd})["cpuDemandCores"] == {}
    assert parse_status(json.loads(GOOD))["cpuDemandCores"] == {}  # an older sidecar


@pytest.mark.parametrize(("body", "code", "message"), [
    (b"not json", 200, "not JSON"),
    (b"[1, 2]", 200, "no 'observed'"),
    (b'{"observed": 3}', 200, "no 'observed'"),
    (b"{}", 500, "HTTP 500"),
    (b" " * (MAX_STATUS_BYTES + 10), 200, "larger than"),
])
def test_bad_answers_are_errors_not_crashes(server: Server, body: bytes, code: int,
                                            message: str) -> None:
    server.body, server.code = body, code
    with pytest.raises(StatusReadError, match=message):
        HttpStatusReader().read("127.0.0.1", server.port)


def test_nobody_listening_is_an_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connection refused
        with pytest.raises(StatusReadError, match="refused"):
            HttpStatusReader().read("127.0.0.1", port)


def test_a_hung_sidecar_times_out(server: Server) -> None:
    server.hang.set()
    with pytest.raises(StatusReadError, match="timed out"):
        HttpStatusReader(timeout_seconds=0.3).read("127.0.0.1", server.port)


def test_a_dribbling_sidecar_is_cut_off_at_the_deadline() -> None:
    """A slow loris: 16 bytes every 0.1 s. A per-read timeout never fires on it; the
    total deadline does, so one slow pod cannot hold the operator's status tick."""
    import time

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    stop = threading.Event()

    def dribble() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(b"HTTP/1.0 200 OK\r\n")
            while not stop.wait(0.1):
                try:
                    conn.sendall(b"X-Padding: 0123\r\n")
                except OSError:
                    return

    threading.Thread(target=dribble, daemon=True).start()
    started = time.monotonic()
    try:
        with pytest.raises(StatusReadError, match="timed out"):
            HttpStatusReader(timeout_seconds=0.5).read("127.0.0.1", listener.getsockname()[1])
        assert time.monotonic() - started < 1.5
    finally:
        stop.set()
        listener.close()
