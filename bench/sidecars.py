"""The sidecar of every KWOK pod for bench/operator_load.py, in a process of its own.

All KWOK pods share one IP (tools/k8s/cluster.py), so one server answers every pod's
GET /status: a real document whose peak moves a little each second (so every read is a
status write, as a measured one is) and whose `slowdown` steps once, on SIGUSR1. It runs
apart from the benchmark, whose watches parse every event of 1,300 ThrottledJobs: in
the same process, their GIL made the stand-in, not the operator, the slow part (reads
past the operator's 2 s deadline). Each second it writes how many reads it answered.

    python -m bench.sidecars HOST PORT HITS_FILE
"""

from __future__ import annotations

import json
import random
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SLOWDOWN_BEFORE, SLOWDOWN_AFTER = 1.12, 1.31


def document(slowdown: float) -> bytes:
    return json.dumps({
        "observed": {"cpuPeakCores": round(random.uniform(0.95, 1.05), 3),
                     "cpuMaxCores": 1.2, "gpuPeakUtilizationPercent": None,
                     "gpuPeakPowerWatts": None, "throttleLevel": 0.3, "slowdown": slowdown},
        "targetMet": True, "budgetExhausted": False, "levers": ["quota"],
        "errors": []}).encode()


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # 24 readers connect at once; the default 5 drops SYNs


def main(argv: list[str]) -> int:
    host, port, hits_file = argv[0], int(argv[1]), Path(argv[2])
    state: dict[str, Any] = {"slowdown": SLOWDOWN_BEFORE, "hits": 0}
    state["body"] = document(state["slowdown"])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state["hits"] += 1
            body = state["body"]
            self.send_response(200 if self.path == "/status" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    def step(*_: Any) -> None:
        state["slowdown"] = SLOWDOWN_AFTER
        state["body"] = document(SLOWDOWN_AFTER)

    signal.signal(signal.SIGUSR1, step)
    server = Server((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    while True:
        time.sleep(1)
        state["body"] = document(state["slowdown"])
        hits_file.write_text(str(state["hits"]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
