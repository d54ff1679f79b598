"""The sidecar's surface: it binds where told, leaks no environment, needs no API access."""

from __future__ import annotations

import subprocess
import sys

import psutil

from testing.helpers import wait_for
from testing.http import free_port, get
from testing.paths import HUNGRY, VENV_BIN

SECRET = "s3cr3t-token-value"
PATHS = ("/metrics", "/status", "/healthz", "/readyz", "/nope", "/status?x=../../etc/passwd")


def listening(pid: int) -> set[str]:
    return {c.laddr.ip for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}


def test_endpoints_expose_no_environment_and_bind_where_told(workload, sidecar):
    proc = workload("--workers", "1", "--units", "100000")
    side = sidecar("targets: {cpu: {peak: 1}}\n", proc.pid, env={"API_TOKEN": SECRET})
    wait_for(lambda: side.status(), timeout=20, what="the sidecar to serve")
    for path in PATHS:
        code, body = get(side.url + path)
        assert code in (200, 404), (path, code)
        assert SECRET not in body and "API_TOKEN" not in body, path
    assert listening(side.proc.pid) == {"127.0.0.1"}


def test_local_metrics_default_to_loopback(tmp_path):
    port = free_port()
    tool = subprocess.Popen([str(VENV_BIN / "throttledjob"), "run", "--quiet", "--metrics-port",
                             str(port), "--", *HUNGRY, "--workers", "1", "--units", "300"])
    try:
        wait_for(lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 200, timeout=20,
                 what="metrics")
        assert listening(tool.pid) == {"127.0.0.1"}
    finally:
        tool.terminate()
        tool.wait(timeout=30)


def test_sidecar_needs_no_kubernetes_client():
    code = ("import sys, throttledjob.sidecar.pod, throttledjob.sidecar.local;"
            "print([m for m in ('kubernetes', 'kopf') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr


def test_a_connection_flood_leaves_the_sidecar_serving_within_bounds(workload, sidecar):
    """1,000 connections that send half a request: the sidecar's threads stay capped, its
    memory grows by little, and /metrics answers again once the stragglers time out."""
    import contextlib
    import socket
    import time

    from throttledjob.serving import CONNECTION_TIMEOUT_SECONDS, MAX_CONNECTIONS

    proc = workload("--workers", "1", "--units", "100000")
    side = sidecar("targets: {cpu: {peak: 1}}\n", proc.pid)
    wait_for(lambda: side.status(), timeout=20, what="the sidecar to serve")
    me = psutil.Process(side.proc.pid)
    threads0, rss0 = me.num_threads(), me.memory_info().rss
    host, port = side.url.removeprefix("http://").split(":")
    flood = []
    try:
        for _ in range(1000):
            s = socket.create_connection((host, int(port)), timeout=5)
            s.setblocking(False)
            with contextlib.suppress(OSError):  # over the cap: closed at once, as meant
                s.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
            flood.append(s)
        time.sleep(0.5)
        assert me.num_threads() <= threads0 + MAX_CONNECTIONS
        assert me.memory_info().rss - rss0 < 8 * 2**20
    finally:
        for s in flood:
            s.close()
    wait_for(lambda: get(side.url + "/metrics")[0] == 200,
             timeout=CONNECTION_TIMEOUT_SECONDS + 10, what="/metrics after the flood")


def test_one_slow_client_cannot_lock_the_kubelet_out(workload, sidecar):
    """Sixteen connections from one address, each sending its request a line every few
    seconds, held every slot: the kubelet's /healthz (and /prestop) failed. One client
    holds at most MAX_PER_CLIENT; another is served meanwhile."""
    import contextlib
    import socket

    from throttledjob.serving import MAX_PER_CLIENT

    proc = workload("--workers", "1", "--units", "100000")
    side = sidecar("targets: {cpu: {peak: 1}}\n", proc.pid)
    wait_for(lambda: side.status(), timeout=20, what="the sidecar to serve")
    host, port = side.url.removeprefix("http://").split(":")
    slow = []
    try:
        for _ in range(3 * MAX_PER_CLIENT):   # another loopback address: another client
            s = socket.create_connection((host, int(port)), timeout=5,
                                         source_address=("127.0.0.2", 0))
            with contextlib.suppress(OSError):  # over its share: closed at once
                s.send(b"GET /healthz HTTP/1.1\r\n")
            slow.append(s)
        assert get(side.url + "/healthz")[0] == 200
    finally:
        for s in slow:
            s.close()
