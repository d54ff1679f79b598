"""`throttledjob sidecar` as the operator runs it: real processes, real files, real signals.

Policy reload through a kubelet-style `..data` symlink swap, the /status contract, and
the fault list of the sidecar issue: a workload left stopped by a dead predecessor, exit
while the workload is stopped, a corrupt progress file, a read-only or full shared directory,
GPUs lost mid-run, and no shared process namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from testing.helpers import require_tool, wait_for
from testing.http import free_port, get, get_json
from testing.paths import HUNGRY, VENV_BIN
from testing.processes import stopped
from testing.workloads import LONG, tree


def project(directory, text: str, version: int) -> None:
    """Write a ConfigMap volume as kubelet does: a new timestamped dir, then swap ..data."""
    data = directory / f"..v{version}"
    data.mkdir()
    (data / "policy.yaml").write_text(text)
    tmp = directory / "..data_tmp"
    tmp.symlink_to(data.name)
    os.replace(tmp, directory / "..data")
    if not (directory / "policy.yaml").is_symlink():
        (directory / "policy.yaml").symlink_to("..data/policy.yaml")


def metric(url: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(get(url + "/metrics")[1]):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def stopped_of(pids) -> list[int]:
    return [pid for pid in pids if stopped(pid)]


def test_status_contract_and_live_policy_reload(tmp_path, workload, sidecar):
    proc = workload(*LONG)
    volume = tmp_path / "config"
    volume.mkdir()
    project(volume, "targets: {cpu: {peak: 1500m}}\nmaxSlowdown: 1.5\nenforcement: Signals\n", 1)
    side = sidecar(volume / "policy.yaml", proc.pid, "--gpu-backend", "auto")
    wait_for(lambda: get(side.url + "/readyz")[0] == 200, timeout=20, what="/readyz")
    st = wait_for(side.status, what="/status")
    assert set(st) >= {"observed", "targetMet", "budgetExhausted", "levers", "targets",
                       "errors", "telemetry"}
    assert set(st["observed"]) >= {"cpuPeakCores", "cpuMaxCores", "gpuPeakUtilizationPercent",
                                   "gpuPeakPowerWatts", "throttleLevel", "slowdown"}
    assert st["observed"]["gpuPeakUtilizationPercent"] is None  # no GPU on this machine
    assert st["telemetry"]["gpu"] == "none"
    assert st["telemetry"]["cpu"].startswith("psutil: process tree")
    assert st["targets"]["cpuPeakCores"] == 1.5 and st["errors"] == []
    assert get(side.url + "/healthz")[0] == 200

    # A live edit: kubelet swaps ..data; the next cycles use the new target.
    project(volume, "targets: {cpu: {peak: 500m}}\nmaxSlowdown: 3\nenforcement: Signals\n", 2)
    wait_for(lambda: side.status()["targets"]["cpuPeakCores"] == 0.5, timeout=10,
             what="reloaded target")
    assert "signals" in wait_for(lambda: side.status()["levers"], what="signals lever")
    # The workload (2 cores of demand) is now held near half a core.
    wait_for(lambda: side.status()["observed"]["cpuCores"] < 0.8, timeout=15,
             what="usage under the new target")

    # A bad edit keeps the last valid policy and says so, in /status and as a metric.
    project(volume, "targets: {cpu: {peak: 500m}}\nmaxSlowdown: 3\nbogus: 1\n", 3)
    st = wait_for(lambda: (s := side.status()) and s["errors"] and s, timeout=10,
                  what="policy error in /status")
    assert "policy" in st["errors"][0] and "bogus" in st["errors"][0]
    assert st["targets"]["cpuPeakCores"] == 0.5 and st["targets"]["maxSlowdown"] == 3
    assert metric(side.url, "throttledjob_problem", kind="policy") == 1
    assert metric(side.url, "throttledjob_policy_reloads_total", result="failure") == 1

    project(volume, "targets: {cpu: {peak: 1}}\nmaxSlowdown: 3\nenforcement: Signals\n", 4)
    wait_for(lambda: side.status()["errors"] == [], timeout=10, what="error cleared")
    assert side.status()["targets"]["cpuPeakCores"] == 1.0
    assert metric(side.url, "throttledjob_policy_reloads_total", result="success") == 3


def test_resumes_a_stopped_workload_on_start_and_everything_on_exit(workload, sidecar):
    proc = workload(*LONG)
    pids = wait_for(lambda: len(tree(proc.pid)) == 3 and tree(proc.pid), what="workers")
    os.killpg(proc.pid, signal.SIGSTOP)  # as a predecessor killed mid-pause leaves it
    wait_for(lambda: len(stopped_of(pids)) == 3, what="workload stopped")
    side = sidecar("targets: {cpu: {peak: 200m}}\nmaxSlowdown: 4\nenforcement: Signals\n",
                   proc.pid)
    wait_for(lambda: not stopped_of(pids), timeout=10, what="workload resumed on start")
    # Now the sidecar itself stops it most of the time (0.2 of 2 cores); exit must resume.
    wait_for(lambda: side.status() and "signals" in side.status()["levers"], timeout=15,
             what="signal enforcement")
    side.proc.send_signal(signal.SIGTERM)
    assert side.proc.wait(timeout=10) == 0
    assert stopped_of(pids) == []
    assert proc.poll() is None  # the workload runs on


def test_corrupt_progress_file_is_reported_and_ignored(workload, sidecar):
    proc = workload(*LONG)
    side = sidecar("targets: {cpu: {peak: 1}}\n", proc.pid)
    wait_for(side.status, timeout=20, what="/status")
    bad = side.shared / "progress-12345.json"
    bad.write_text('{"schema": 1, "pid": ')
    st = wait_for(lambda: (s := side.status()) and s["errors"] and s, timeout=10,
                  what="progress error")
    assert st["errors"][0].startswith("progress: ignoring 1 unreadable progress file")
    assert metric(side.url, "throttledjob_errors_total", kind="progress") == 1
    bad.unlink()
    wait_for(lambda: side.status()["errors"] == [], timeout=10, what="progress error cleared")
    assert side.proc.poll() is None


MOUNTS = {
    # A real read-only filesystem, and a real full one (a one-page tmpfs, filled up).
    "read-only": "mount -t tmpfs -o ro tmpfs {d}",
    "full": "mount -t tmpfs -o size=4k tmpfs {d} && (cat /dev/zero > {d}/fill 2>/dev/null;"
            " true)",
}


@pytest.mark.parametrize("fault", sorted(MOUNTS))
def test_unwritable_shared_dir_is_reported_and_the_loop_keeps_running(tmp_path, workload,
                                                                      sidecar, fault):
    proc = workload(*LONG)
    shared = tmp_path / "shared"
    shared.mkdir()
    prefix = None
    if os.geteuid() == 0:
        # Root ignores file modes: mount a real filesystem in a private mount namespace.
        unshare = require_tool("unshare")
        prefix = [unshare, "-m", "sh", "-c",
                  MOUNTS[fault].format(d=shared) + ' && exec "$@"', "sh"]
    elif fault == "read-only":
        shared.chmod(0o500)
    else:
        pytest.skip("filling a filesystem needs a private mount namespace (root)")
    side = sidecar("targets: {cpu: {peak: 1}}\nmaxSlowdown: 3\nenforcement: Signals\n", proc.pid,
                   shared=shared, prefix=prefix)
    st = wait_for(lambda: (s := side.status()) and s["errors"] and s, timeout=20,
                  what="settings error")
    assert any(e.startswith("settings: cannot write settings") for e in st["errors"])
    assert metric(side.url, "throttledjob_problem", kind="settings") == 1
    cycles = metric(side.url, "throttledjob_cycles_total")
    wait_for(lambda: metric(side.url, "throttledjob_cycles_total") > cycles, timeout=10,
             what="more cycles")
    # No stop the guard could not resume: without the shared directory there is no stop
    # lease, so signals fail open (the workload runs free) and say why.
    st = wait_for(lambda: (s := side.status()) and any(
        e.startswith("signals: cannot write the stop lease") for e in s["errors"]) and s,
        timeout=20, what="the stop lease's error")
    assert metric(side.url, "throttledjob_problem", kind="signals") == 1
    pids = tree(proc.pid)
    for _ in range(200):  # a second: held at 1 core of 2, it would be stopped half of it
        assert stopped_of(pids) == [], "stopped without a stop lease"
        time.sleep(0.005)


def test_gpu_lost_mid_run_degrades_to_cpu_only_and_says_so_once(workload, sidecar):
    proc = workload(*LONG)
    side = sidecar("targets: {cpu: {peak: 1}, gpu: {peakUtilizationPercent: 70}}\n"
                   "maxSlowdown: 2\n", proc.pid, "--gpu-backend", "fake",
                   env={"THROTTLEDJOB_FAKE_GPUS": "2", "THROTTLEDJOB_FAKE_GPU_FAIL_AFTER": "4"})
    st = wait_for(side.status, timeout=20, what="/status")
    assert st["telemetry"]["gpu"] == "fake (simulated)" and len(st["telemetry"]["gpus"]) == 2
    st = wait_for(lambda: (s := side.status()) and s["errors"] and s, timeout=20,
                  what="GPU loss reported")
    assert "gpu: GPU telemetry lost" in st["errors"][0] and "CPU-only" in st["errors"][0]
    assert st["telemetry"]["gpus"] == []
    assert metric(side.url, "throttledjob_telemetry_available", resource="gpu") == 0
    assert metric(side.url, "throttledjob_gpu_utilization_ratio", gpu="0") is None
    # The CPU side keeps going.
    cycles = metric(side.url, "throttledjob_cycles_total")
    wait_for(lambda: metric(side.url, "throttledjob_cycles_total") > cycles + 1, timeout=10,
             what="CPU cycles after the GPU loss")
    assert side.status()["observed"]["cpuCores"] > 0
    side.proc.send_signal(signal.SIGTERM)
    side.proc.wait(timeout=10)
    assert side.stderr().count("GPU telemetry lost") == 1


@pytest.fixture
def pid_namespace():
    """Run a command line in a new PID namespace, as the containers of a pod share one,
    and (unless `in_pod=False`) in a cgroup named like a pod's, as a kubelet puts them."""
    if os.geteuid() != 0:
        pytest.skip("a PID namespace needs root here")  # CI runs as root
    unshare = require_tool("unshare")
    procs, cgroups = [], []

    def start(script: str, in_pod: bool = True) -> subprocess.Popen:
        argv = [unshare, "--fork", "--pid", "--mount-proc", "--kill-child", "sh", "-c", script]
        if in_pod:
            base = Path("/sys/fs/cgroup/cpu") / f"throttledjob-test-{uuid.uuid4().hex[:8]}"
            pod = base / "kubepods" / "podtest"
            pod.mkdir(parents=True)
            cgroups.extend([pod, base / "kubepods", base])
            argv = ["sh", "-c", f"echo $$ > {pod}/cgroup.procs && exec {shlex.join(argv)}"]
        p = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
        procs.append(p)
        return p

    yield start
    for p in procs:
        # pid 1 of a namespace ignores SIGTERM without a handler: SIGKILL unshare, and
        # --kill-child takes the whole namespace down with it.
        p.kill()
        p.wait(timeout=20)
    for g in cgroups:
        deadline = time.monotonic() + 10
        while g.exists() and time.monotonic() < deadline:  # emptied as the namespace dies
            with contextlib.suppress(OSError):
                g.rmdir()
            time.sleep(0.05)


def sidecar_line(policy, shared, port: int) -> str:
    return (f"{VENV_BIN / 'throttledjob'} sidecar --policy {policy} --shared-dir {shared} "
            f"--host 127.0.0.1 --port {port} --gpu-backend none")


def test_shared_process_namespace_finds_the_workload_itself(tmp_path, pid_namespace):
    policy = tmp_path / "policy.yaml"
    policy.write_text("targets: {cpu: {peak: 700m}}\nmaxSlowdown: 4\nenforcement: Signals\n")
    (tmp_path / "shared").mkdir()
    port = free_port()
    hungry = " ".join([*HUNGRY, *LONG])
    pid_namespace(f"{hungry} & {sidecar_line(policy, tmp_path / 'shared', port)}; wait")
    url = f"http://127.0.0.1:{port}"
    st = wait_for(lambda: (s := get_json(url + "/status")) and s["observed"]["cpuCores"] > 0
                  and s, timeout=20, what="/status from the namespace")
    assert st["telemetry"]["cpu"].startswith("psutil: shared process namespace")
    assert st["telemetry"]["processes"] >= 3  # sh (pid 1 here), the workload, its 2 workers
    wait_for(lambda: get_json(url + "/status")["observed"]["cpuCores"] < 1.0, timeout=20,
             what="the workload held near 0.7 cores")


def test_outside_a_pod_cgroup_it_measures_but_stops_nothing(tmp_path, pid_namespace):
    """Which processes are the pod's is told by the pod's cgroup (with hostPID the
    namespace is the node's): where there is none, signalling anything could stop a
    process that is not the workload's, so nothing is signalled."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("targets: {cpu: {peak: 700m}}\nmaxSlowdown: 4\nenforcement: Signals\n")
    (tmp_path / "shared").mkdir()
    port = free_port()
    hungry = " ".join([*HUNGRY, *LONG])
    ns = pid_namespace(f"{hungry} & {sidecar_line(policy, tmp_path / 'shared', port)}; wait",
                       in_pod=False)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: (s := get_json(url + "/status")) and s["observed"]["cpuCores"] > 0,
             timeout=20, what="/status from the namespace")
    workers = [p for p in psutil.Process(ns.pid).children(recursive=True)
               if "cpu_hungry" in " ".join(p.cmdline())]
    assert workers
    seen = set()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        seen |= {p.status() for p in workers}
        time.sleep(0.005)
    assert psutil.STATUS_STOPPED not in seen


def test_without_a_shared_namespace_it_says_what_it_cannot_see(tmp_path, pid_namespace):
    policy = tmp_path / "policy.yaml"
    policy.write_text("targets: {cpu: {peak: 1}}\n")
    (tmp_path / "shared").mkdir()
    port = free_port()
    # Alone in its namespace (pid 1 is the sidecar itself), as in a pod without
    # shareProcessNamespace.
    pid_namespace(f"exec {sidecar_line(policy, tmp_path / 'shared', port)}")
    url = f"http://127.0.0.1:{port}"
    st = wait_for(lambda: (s := get_json(url + "/status")) and s["errors"] and s, timeout=20,
                  what="/status with a problem")
    assert "no workload process visible" in st["telemetry"]["cpu"]
    assert st["errors"] == ["processes: no workload process visible: is "
                            "shareProcessNamespace on?"]
    assert get(url + "/healthz")[0] == 200


def test_sidecar_requires_its_flags():
    proc = subprocess.run([str(VENV_BIN / "throttledjob"), "sidecar"], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2 and "--policy" in proc.stderr
    assert shutil.which("sh") and sys.executable


# A workload that saves a checkpoint on SIGTERM: about 0.4 s of CPU, then the file,
# with the handler's own wall and CPU time in it.
CHECKPOINTER = """
import json, signal, sys, time
def save(*_):
    wall, cpu = time.monotonic(), time.process_time()
    n = 0
    while time.process_time() - cpu < 0.4:
        n += 1
    json.dump({"wall": time.monotonic() - wall, "cpu": time.process_time() - cpu},
              open(sys.argv[1], "w"))
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
while True:
    pass
"""


def checkpoint_under_signals(tmp_path, spawn, sidecar, name: str,
                             prestop: bool) -> dict[str, float]:
    """Hold the checkpointer at 0.2 core by signals, then terminate it as the kubelet
    does (preStop hook first, if `prestop`, then SIGTERM); the handler's figures."""
    out = tmp_path / f"{name}.json"
    proc = spawn([sys.executable, "-c", CHECKPOINTER, str(out)])
    side = sidecar("targets: {cpu: {peak: 200m}}\nmaxSlowdown: 8\nenforcement: Signals\n",
                   proc.pid, shared=tmp_path / f"shared-{name}")
    wait_for(lambda: stopped_of([proc.pid]), timeout=20, interval=0.005,
             what="the sidecar stopping the workload")
    if prestop:
        assert get(side.url + "/prestop")[0] == 200
        # Nothing stopped from the hook's answer on, and no quota published to pace by.
        for _ in range(50):
            assert stopped_of([proc.pid]) == [], "stopped after the preStop hook"
            time.sleep(0.01)
        settings = json.loads((tmp_path / f"shared-{name}" / "settings.json").read_text())
        assert settings["cpu_quota_cores"] is None, settings
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    side.proc.send_signal(signal.SIGTERM)
    side.proc.wait(timeout=10)
    return json.loads(out.read_text())


def test_the_prestop_hook_ends_throttling_so_a_checkpoint_is_saved_at_full_speed(
        tmp_path, spawn, sidecar):
    """The kubelet calls the workload containers' preStop hook (GET /prestop on the
    sidecar) before it sends them SIGTERM: the handler that saves the checkpoint runs
    unthrottled. Without the hook (the baseline, same run) signals duty-cycle it."""
    held = checkpoint_under_signals(tmp_path, spawn, sidecar, "held", prestop=False)
    freed = checkpoint_under_signals(tmp_path, spawn, sidecar, "freed", prestop=True)
    print(f"checkpoint handler: under signals {held}; after preStop {freed}")
    assert held["wall"] > 2 * held["cpu"], held  # the baseline really is held back
    assert freed["wall"] < 1.5 * freed["cpu"], freed
