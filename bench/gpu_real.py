"""GPU targets on a real board: training time, and every second's utilization and power
against the target, sampled through NVML by the benchmark itself.

    .venv/bin/python -m bench.gpu_real [--steps 1500] [--pause-study]

Runs bench/gpu_train.py (a small GPT, random tokens) unthrottled, then under
`throttledjob run --inject` with a utilization target and a power target (each a
fraction of the unthrottled p99, `--fraction`), paired in one invocation. The sampler
reads GPU 0 every 100 ms; a 1-second sample is NVML's reading at each whole second after
the first optimizer step (utilization is NVML's own window; power on recent boards is a
1-second average). `--pause-study` adds open-loop hold-backs (a fixed duty in pauses of a
fixed length, with and without a device synchronize) and the board's floor: what a pace
point does to the board. Only reads: never sets a power limit, clock or any setting.
Prints what the GPU was, then the table; `--json` keeps the traces.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.harness import markdown
from testing.paths import ROOT
from throttledjob.sidecar.stats import nearest_rank

TRAIN = ROOT / "bench" / "gpu_train.py"
# --tiny: a model small enough for a CPU (the suite's run on the simulated board).
TINY = ["--width", "64", "--layers", "1", "--context", "32"]
MODEL: list[str] = []
SAMPLE_SECONDS = 0.1
WITHIN = 0.05         # the bar: each second within 5% of the target


class Sampler(threading.Thread):
    """GPU 0 every SAMPLE_SECONDS: (wall time, utilization %, power W, instant power W)."""

    def __init__(self, nvml) -> None:
        super().__init__(daemon=True)
        self.n = nvml
        self.h = nvml.nvmlDeviceGetHandleByIndex(0)
        self.trace: list[tuple[float, float, float, float | None]] = []
        self.done = threading.Event()

    def instant_power(self) -> float | None:
        n = self.n
        try:
            v = n.nvmlDeviceGetFieldValues(self.h, [n.NVML_FI_DEV_POWER_INSTANT])[0]
            return None if v.nvmlReturn else v.value.uiVal / 1000.0
        except Exception:
            return None

    def run(self) -> None:
        n = self.n
        while not self.done.is_set():
            self.trace.append((time.time(), float(n.nvmlDeviceGetUtilizationRates(self.h).gpu),
                               n.nvmlDeviceGetPowerUsage(self.h) / 1000.0,
                               self.instant_power()))
            self.done.wait(SAMPLE_SECONDS)


def board(nvml) -> dict:
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


def run_case(nvml, cmd: list[str], steps: int, memory_probe: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        sampler = Sampler(nvml)
        sampler.start()
        began = time.time()
        proc = subprocess.Popen([*cmd, sys.executable, str(TRAIN), "--steps", str(steps),
                                 "--out", out, *MODEL], cwd=ROOT, env={**os.environ,
                                 "PYTHONPATH": str(ROOT / "src")})
        memory = None
        if memory_probe:
            while proc.poll() is None and not os.path.exists(out):
                time.sleep(0.5)
                if memory is None and time.time() - began > 12:
                    memory = memory_now(nvml)
        rc = proc.wait()
        sampler.done.set()
        sampler.join()
        if rc != 0:
            raise RuntimeError(f"{cmd} exited {rc}")
        result = json.loads(Path(out).read_text())
        report_path = os.path.join(tmp, "report.json")
        report = json.loads(Path(report_path).read_text()) if os.path.exists(report_path) \
            else None
    return {"result": result, "trace": sampler.trace, "memory": memory, "report": report}


def seconds(case: dict) -> list[tuple[float, float, float]]:
    """1-second samples (second, util %, power W) from the first step to the end."""
    first, end = case["result"]["first_step_time"], case["result"]["end_time"]
    out, mark = [], first + 1.0
    for t, util, power, _ in case["trace"]:
        if t >= mark and t <= end:
            out.append((round(mark - first), util, power))
            mark += 1.0
    return out


def figures(case: dict, base_seconds: float, target: float | None, column: int) -> dict:
    samples = seconds(case)
    values = [s[column] for s in samples]
    settled = [s[column] for s in samples if s[0] > 2]
    start = [s[column] for s in samples if s[0] <= 2]
    row = {"time ratio": round(case["result"]["seconds"] / base_seconds, 3),
           "p99": round(nearest_rank(values, 0.99), 1), "max": round(max(values), 1),
           "mean": round(statistics.fmean(values), 1)}
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
    return row


def throttled(*options: str) -> list[str]:
    return [sys.executable, "-m", "throttledjob", "run", "--quiet", "--inject",
            "--max-slowdown", "3", *options, "--"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--train-seconds", type=float, default=0.0,
                        help="scale --steps so that the unthrottled run trains about this long")
    parser.add_argument("--fraction", type=float, default=0.6,
                        help="targets as this fraction of the unthrottled p99")
    parser.add_argument("--pause-study", action="store_true")
    parser.add_argument("--tiny", action="store_true", help="a model small enough for a CPU")
    parser.add_argument("--json", default=str(ROOT / "bench" / "out" / "gpu_real.json"))
    args = parser.parse_args(argv)
    MODEL[:] = TINY if args.tiny else []
    import pynvml

    pynvml.nvmlInit()
    everything = {"board": board(pynvml)}
    print(json.dumps(everything["board"]), flush=True)
    base = run_case(pynvml, [], args.steps, memory_probe=True)
    if args.train_seconds and base["result"]["seconds"] < 0.75 * args.train_seconds:
        args.steps = int(args.steps * args.train_seconds / base["result"]["seconds"])
        base = run_case(pynvml, [], args.steps, memory_probe=True)
    everything["memory"] = base["memory"]
    print("memory used, one moment:", json.dumps(base["memory"]), flush=True)
    base_s = base["result"]["seconds"]
    free_util = figures(base, base_s, None, 1)
    free_power = figures(base, base_s, None, 2)
    rows = [{"case": "unthrottled", "measure": "util %", **free_util},
            {"case": "unthrottled", "measure": "power W", **free_power}]
    cases = {"unthrottled": base}

    def save() -> None:
        everything["rows"], everything["cases"] = rows, cases
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(everything))

    save()
    if args.pause_study:
        for duty, pause_ms, sync in ((0.4, 20, False), (0.4, 20, True), (0.4, 100, True),
                                     (0.4, 400, True), (0.2, 100, True), (0.9, 2000, True)):
            name = f"open-loop duty {duty} pauses {pause_ms} ms{' sync' if sync else ''}"
            extra = ["--duty", str(duty), "--pause-ms", str(pause_ms)] + (["--sync"] * sync)
            steps = args.steps // 10 if duty > 0.5 else args.steps // 2
            case = _open_loop(pynvml, steps, extra)
            cases[name] = case
            for col, measure in ((1, "util %"), (2, "power W")):
                rows.append({"case": name, "measure": measure, **figures(
                    case, base_s * steps / args.steps, None, col)})
            print(markdown(rows[-2:]), flush=True)
            save()
    targets = {"util": args.fraction * free_util["p99"],
               "power": args.fraction * free_power["p99"]}
    for name, column, flag in (("util", 1, "--gpu-peak-util"), ("power", 2, "--gpu-peak-power")):
        with tempfile.TemporaryDirectory() as tmp:
            report = os.path.join(tmp, "r.json")
            cmd = throttled(flag, f"{targets[name]:.1f}", "--report", report)
            case = run_case(pynvml, cmd, args.steps)
            case["report"] = json.loads(Path(report).read_text()) if os.path.exists(report) \
                else None
        label = f"{flag} {targets[name]:.1f}"
        cases[label] = case
        rows.append({"case": label, "measure": "util %" if column == 1 else "power W",
                     **figures(case, base_s, targets[name], column)})
        print(markdown(rows[-1:]), flush=True)
        save()
    print()
    print(markdown([{k: r.get(k, "") for k in _columns(rows)} for r in rows]))
    pynvml.nvmlShutdown()
    return 0


def _open_loop(nvml, steps: int, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        sampler = Sampler(nvml)
        sampler.start()
        subprocess.run([sys.executable, str(TRAIN), "--steps", str(steps), "--out", out, *extra,
                        *MODEL],
                       check=True, cwd=ROOT)
        sampler.done.set()
        sampler.join()
        return {"result": json.loads(Path(out).read_text()), "trace": sampler.trace,
                "memory": None, "report": None}


def _columns(rows: list[dict]) -> list[str]:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    return keys


if __name__ == "__main__":
    sys.exit(main())
