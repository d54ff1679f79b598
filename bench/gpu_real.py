"""GPU targets on a real board: training time, and every second's utilization and power
against the target, sampled through NVML by the benchmark itself.

    .venv/bin/python -m bench.gpu_real [--steps 1500] [--train-seconds 20] [--pause-study]
    PYTHONPATH=src python3 -m bench.gpu_real ...   # a GPU machine with torch and no venv
    .venv/bin/python -m bench.gpu_real --simulated --tiny --steps 400   # no GPU: the table

Runs bench/gpu_train.py (a small GPT, random tokens) unthrottled, then under
`throttledjob run --inject` with a utilization target and a power target (each a
fraction of the unthrottled p99, `--fraction`), paired in one invocation. The sampler
reads GPU 0 every 100 ms; a 1-second sample is NVML's reading at each whole second after
the first optimizer step (utilization is NVML's own window; power on recent boards is a
1-second average). `--pause-study` adds open-loop hold-backs (a fixed duty in pauses of a
fixed length, with and without a device synchronize) and the board's floor: what a pace
point does to the board. Only reads: never sets a power limit, clock or any setting.
Prints what the GPU was, then the table; `--json` keeps the traces. `--simulated` runs
the same cases on the simulated board (gpu/fake.py), read from the run's own
/metrics, with a CPU stand-in of the model (`--tiny`): the suite's smoke run, whose
figures describe the simulator, not a GPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from bench.harness import markdown
from testing.http import free_port
from testing.paths import ROOT
from throttledjob.sidecar.stats import nearest_rank, round_or_none

TRAIN = ROOT / "bench" / "gpu_train.py"
# --tiny: a model small enough for a CPU (the suite's run on the simulated board).
TINY = ["--width", "64", "--layers", "1", "--context", "32", "--vocab", "256"]
MODEL: list[str] = []
SAMPLE_SECONDS = 0.1
WITHIN = 0.05         # the bar: each second within 5% of the target
WARM_UP_STEPS = 20   # an untimed run first (measure)


class NvmlReader:
    """GPU 0 of a real board: utilization %, power W (NVML's 1-second average on recent
    boards) and instant power W where the driver has it."""

    def __init__(self, nvml) -> None:
        self.n = nvml
        self.h = nvml.nvmlDeviceGetHandleByIndex(0)

    def read(self) -> tuple[float, float, float | None] | None:
        n = self.n
        return (float(n.nvmlDeviceGetUtilizationRates(self.h).gpu),
                n.nvmlDeviceGetPowerUsage(self.h) / 1000.0, self.instant_power())

    def instant_power(self) -> float | None:
        n = self.n
        try:
            v = n.nvmlDeviceGetFieldValues(self.h, [n.NVML_FI_DEV_POWER_INSTANT])[0]
            return None if v.nvmlReturn else v.value.uiVal / 1000.0
        except Exception:
            return None


class MetricsReader:
    """The simulated board lives in the `throttledjob run` process that drives it: read
    GPU 0 where that process publishes it, its own /metrics (`--metrics-port`)."""

    SERIES = re.compile(r'^throttledjob_gpu_(utilization_ratio|power_watts)'
                        r'\{[^}]*\bgpu="0"[^}]*\} (\S+)$', re.MULTILINE)

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"

    def read(self) -> tuple[float, float, float | None] | None:
        try:
            with urllib.request.urlopen(self.url, timeout=1) as r:
                text = r.read().decode()
        except OSError:
            return None   # not serving yet, or gone
        found = {name: float(value) for name, value in self.SERIES.findall(text)}
        if len(found) < 2:
            return None
        return found["utilization_ratio"] * 100.0, found["power_watts"], None


class Sampler(threading.Thread):
    """GPU 0 every SAMPLE_SECONDS: (wall time, utilization %, power W, instant power W)."""

    def __init__(self, reader: NvmlReader | MetricsReader) -> None:
        super().__init__(daemon=True)
        self.reader = reader
        self.trace: list[tuple[float, float, float, float | None]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            reading = self.reader.read()
            if reading is not None:
                self.trace.append((time.time(), *reading))
            self.done.wait(SAMPLE_SECONDS)


def describe_board(nvml) -> dict:
    """What the GPU is, read only."""
    n, h = nvml, nvml.nvmlDeviceGetHandleByIndex(0)
    low, high = n.nvmlDeviceGetPowerManagementLimitConstraints(h)
    info = {"name": n.nvmlDeviceGetName(h), "driver": n.nvmlSystemGetDriverVersion(),
            "power_limit_w": n.nvmlDeviceGetEnforcedPowerLimit(h) / 1000,
            "power_limit_range_w": [low / 1000, high / 1000],
            "memory_total_mib": n.nvmlDeviceGetMemoryInfo(h).total // 2**20}
    for kind, key in (("NVML_GPU_UTILIZATION_SAMPLES", "util_sample_period_ms"),
                      ("NVML_TOTAL_POWER_SAMPLES", "power_sample_period_ms")):
        try:
            _, samples = n.nvmlDeviceGetSamples(h, getattr(n, kind), 0)
            stamps = sorted(s.timeStamp for s in samples)
            gaps = [b - a for a, b in itertools.pairwise(stamps) if b > a]
            info[key] = round(statistics.median(gaps) / 1000, 1) if gaps else None
        except Exception as e:
            info[key] = f"unreadable: {e}"
    return info


def memory_now(nvml) -> dict:
    """GPU 0's memory used by NVML's v1 and v2 structs and by nvidia-smi, one moment."""
    n, h = nvml, nvml.nvmlDeviceGetHandleByIndex(0)
    out = {"v1_mib": n.nvmlDeviceGetMemoryInfo(h).used // 2**20}
    try:
        out["v2_mib"] = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2).used // 2**20
    except Exception as e:
        out["v2_mib"] = f"unreadable: {e}"
    smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                          "-i", "0"], capture_output=True, text=True)
    out["nvidia_smi_mib"] = int(smi.stdout.split()[0]) if smi.returncode == 0 else None
    return out


class Board:
    """Where the figures come from, and how a case is run there: a real board read through
    NVML (the unthrottled case is the plain command), or the simulated one (every case
    under `throttledjob run --gpu-backend fake`, which drives it and publishes it)."""

    def __init__(self, simulated: bool) -> None:
        self.simulated = simulated
        self.nvml = None
        self.port = free_port()
        if not simulated:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml

    def reader(self) -> NvmlReader | MetricsReader:
        return MetricsReader(self.port) if self.simulated else NvmlReader(self.nvml)

    def describe(self) -> dict:
        if self.simulated:
            return {"name": "simulated (gpu/fake.py, trace steady)"}
        return describe_board(self.nvml)

    def command(self, *options: str) -> list[str]:
        """The prefix that runs a case: no options, unthrottled."""
        tool = [sys.executable, "-m", "throttledjob", "run", "--quiet"]
        if self.simulated:
            # The hook in every case, so that the simulated board idles until the first
            # step, as a real one does until its feeder launches kernels.
            tool += ["--gpu-backend", "fake", "--metrics-port", str(self.port), "--inject"]
        elif options:
            tool += ["--inject"]
        else:
            return []
        if options:
            tool += ["--max-slowdown", "3", *options]
        return [*tool, "--"]

    def close(self) -> None:
        if self.nvml:
            self.nvml.nvmlShutdown()


def run_case(board: Board, prefix: list[str], steps: int, extra: list[str] = (),
             memory_probe: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out, report = os.path.join(tmp, "result.json"), os.path.join(tmp, "report.json")
        if prefix:
            prefix = [*prefix[:-1], "--report", report, "--"]
        sampler = Sampler(board.reader())
        sampler.start()
        began = time.time()
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"),
               "THROTTLEDJOB_FAKE_GPU_TRACE": "steady", "THROTTLEDJOB_FAKE_GPU_START": "first-step"}
        proc = subprocess.Popen([*prefix, sys.executable, str(TRAIN), "--steps", str(steps),
                                 "--out", out, *extra, *MODEL], cwd=ROOT, env=env)
        memory = None
        while proc.poll() is None:
            time.sleep(0.5)
            if memory_probe and memory is None and time.time() - began > 12:
                memory = memory_now(board.nvml)
        wall = time.time() - began
        sampler.done.set()
        sampler.join()
        if proc.returncode != 0:
            raise RuntimeError(f"{prefix} {TRAIN.name} exited {proc.returncode}")
        result = json.loads(Path(out).read_text())
        loaded = json.loads(Path(report).read_text()) if os.path.exists(report) else None
    return {"result": result, "trace": sampler.trace, "memory": memory, "report": loaded,
            "wall": wall}


def seconds(case: dict) -> list[tuple[float, float, float]]:
    """1-second samples (second, util %, power W) from the first step to the end."""
    first, end = case["result"]["first_step_time"], case["result"]["end_time"]
    out, mark = [], first + 1.0
    for t, util, power, _ in case["trace"]:
        if t >= mark and t <= end:
            out.append((round(mark - first), util, power))
            mark += 1.0
    return out


def figures(case: dict, base_seconds: float, target: float | None, column: int,
            base_wall: float | None = None) -> dict:
    """`base_seconds`: the unthrottled run's training time; `base_wall`: its command's
    whole run (start-up included), what the report's estimate describes."""
    samples = seconds(case)
    values = [s[column] for s in samples]
    settled = [s[column] for s in samples if s[0] > 2]
    start = [s[column] for s in samples if s[0] <= 2]
    row = {"time ratio": round(case["result"]["seconds"] / base_seconds, 3),
           "p99": round_or_none(nearest_rank(values, 0.99), 1),
           "max": round_or_none(max(values, default=None), 1),
           "mean": round_or_none(statistics.fmean(values) if values else None, 1)}
    if target is not None:
        row["target"] = round(target, 1)
        row["start max"] = round(max(start), 1) if start else None
        row["settled within 5%"] = (f"{sum(abs(v - target) <= WITHIN * target for v in settled)}"
                                    f"/{len(settled)}")
        row["settled mean vs target"] = round(statistics.fmean(settled) / target, 3) \
            if settled else None
        controller = (case.get("report") or {}).get("controller") or {}
        row["estimate"] = controller.get("estimated_slowdown")
        row["estimate top"] = controller.get("estimated_slowdown_high")
        if base_wall:
            row["wall ratio"] = round(case["wall"] / base_wall, 3)
    return row


PAUSES = ((0.4, 20, False), (0.4, 20, True), (0.4, 100, True), (0.4, 400, True),
          (0.2, 100, True), (0.9, 2000, True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--train-seconds", type=float, default=0.0,
                        help="scale --steps so that the unthrottled run trains about this long")
    parser.add_argument("--fraction", type=float, default=0.6,
                        help="targets as this fraction of the unthrottled p99")
    parser.add_argument("--pause-study", action="store_true")
    parser.add_argument("--simulated", action="store_true",
                        help="the simulated board (no GPU needed): its table only")
    parser.add_argument("--tiny", action="store_true", help="a model small enough for a CPU")
    parser.add_argument("--json", default=str(ROOT / "bench" / "out" / "gpu_real.json"))
    args = parser.parse_args(argv)
    if args.simulated and args.pause_study:
        parser.error("--pause-study needs a real board")
    MODEL[:] = TINY if args.tiny else []
    board = Board(args.simulated)
    try:
        return measure(board, args)
    finally:
        board.close()


def measure(board: Board, args: argparse.Namespace) -> int:
    everything: dict = {"board": board.describe()}
    print(json.dumps(everything["board"]), flush=True)
    probe = not board.simulated
    # Untimed: the first run of a machine pays for reading torch (and CUDA's kernels) from
    # disk, which inflated the unthrottled wall and so shrank every wall ratio (1.32
    # where the run after read 1.50-1.58).
    run_case(board, board.command(), WARM_UP_STEPS)
    base = run_case(board, board.command(), args.steps, memory_probe=probe)
    if args.train_seconds and base["result"]["seconds"] < 0.75 * args.train_seconds:
        args.steps = int(args.steps * args.train_seconds / base["result"]["seconds"])
        base = run_case(board, board.command(), args.steps, memory_probe=probe)
    if probe:
        everything["memory"] = base["memory"]
        print("memory used, one moment:", json.dumps(base["memory"]), flush=True)
    base_s = base["result"]["seconds"]
    free_util, free_power = figures(base, base_s, None, 1), figures(base, base_s, None, 2)
    rows = [{"case": "unthrottled", "measure": "util %", **free_util},
            {"case": "unthrottled", "measure": "power W", **free_power}]
    cases = {"unthrottled": base}

    def save() -> None:
        everything["rows"], everything["cases"] = rows, cases
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(everything))

    save()
    for duty, pause_ms, sync in PAUSES if args.pause_study else ():
        name = f"open-loop duty {duty} pauses {pause_ms} ms{' sync' if sync else ''}"
        extra = ["--duty", str(duty), "--pause-ms", str(pause_ms)] + (["--sync"] * sync)
        steps = args.steps // 10 if duty > 0.5 else args.steps // 2
        cases[name] = case = run_case(board, [], steps, extra)
        for col, measure in ((1, "util %"), (2, "power W")):
            rows.append({"case": name, "measure": measure,
                         **figures(case, base_s * steps / args.steps, None, col)})
        print(markdown(rows[-2:]), file=sys.stderr, flush=True)
        save()
    if free_util["p99"] is None or free_power["p99"] is None:
        sys.exit(f"gpu_real: the unthrottled run trained {base_s:.1f} s, under one sample: "
                 "give more --steps")
    targets = {"util": args.fraction * free_util["p99"],
               "power": args.fraction * free_power["p99"]}
    for name, column, flag in (("util", 1, "--gpu-peak-util"), ("power", 2, "--gpu-peak-power")):
        label = f"{flag} {targets[name]:.1f}"
        cases[label] = case = run_case(board, board.command(flag, f"{targets[name]:.1f}"),
                                       args.steps)
        rows.append({"case": label, "measure": "util %" if column == 1 else "power W",
                     **figures(case, base_s, targets[name], column, base["wall"])})
        print(markdown(rows[-1:]), file=sys.stderr, flush=True)
        save()
    print()
    print(markdown([{k: r.get(k, "") for k in _columns(rows)} for r in rows]))
    return 0


def _columns(rows: list[dict]) -> list[str]:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    return keys


if __name__ == "__main__":
    sys.exit(main())
