"""The sidecar of every KWOK pod for bench/operator_load.py, in a process of its own.

All KWOK pods share one IP (tools/k8s/cluster.py), so one server answers every pod's
GET /status: a real document whose peak moves by up to 5% each second, as a measured one
does, and whose `slowdown` steps once, on SIGUSR1. It runs
apart from the benchmark, whose watches parse every event of 1,300 ThrottledJobs: in
the same process, their GIL made the stand-in, not the operator, the slow part (reads
past the operator's 2 s deadline). Each second it writes how many reads it answered.

    python -m bench.sidecars HOST PORT HITS_FILE
"""

from __future__ import annotations

import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

from testing.fake_sidecar import FakeSidecar

SLOWDOWN_BEFORE, SLOWDOWN_AFTER = 1.12, 1.31


def document(slowdown: float) -> dict[str, Any]:
    return {"observed": {"cpuPeakCores": round(random.uniform(0.95, 1.05), 3),
                         "cpuMaxCores": 1.2, "gpuPeakUtilizationPercent": None,
                         "gpuPeakPowerWatts": None, "throttleLevel": 0.3,
                         "slowdown": slowdown},
            "targetMet": True, "budgetExhausted": False, "levers": ["quota"], "errors": []}


def main(argv: list[str]) -> int:
    host, port, hits_file = argv[0], int(argv[1]), Path(argv[2])
    server = FakeSidecar(port, host=host)
    slowdown = [SLOWDOWN_BEFORE]

    def step(*_: Any) -> None:
        slowdown[0] = SLOWDOWN_AFTER
        server.doc = document(SLOWDOWN_AFTER)

    signal.signal(signal.SIGUSR1, step)
    while True:
        server.doc = document(slowdown[0])
        partial = hits_file.with_suffix(".partial")  # read whole or not at all
        partial.write_text(str(server.hits))
        partial.replace(hits_file)
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
