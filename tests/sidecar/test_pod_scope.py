"""In a pod the sidecar takes only its own pod's processes for the workload: with hostPID
the process namespace is the node's, and a process of another pod, or the kubelet, must
never be measured or stopped. Real processes in real cgroups (v1 cpu hierarchy, root)."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import time
import uuid
from pathlib import Path

import psutil
import pytest

from testing.helpers import wait_for
from testing.http import free_port, get_json
from testing.paths import HUNGRY, VENV_BIN
from testing.processes import stop
from throttledjob.sidecar.cpu.cgroups.fs import in_cgroup, pod_cgroup

CPU_HIERARCHY = Path("/sys/fs/cgroup/cpu")


def test_the_pod_cgroup_is_found_on_cgroupfs_systemd_and_nowhere_else():
    v1 = "12:cpu,cpuacct:/kubepods/burstable/pod1234-ab/0f3c9e\n11:pids:/kubepods/pod1/x\n"
    v2 = ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_ab.slice/"
          "cri-containerd-0f3c.scope\n")
    assert pod_cgroup(v1) == "/kubepods/burstable/pod1234-ab"
    assert pod_cgroup(v2) == ("/kubepods.slice/kubepods-burstable.slice/"
                              "kubepods-burstable-pod12_ab.slice")
    assert pod_cgroup("0::/\n") is None and pod_cgroup(None) is None
    assert in_cgroup(v1, "/kubepods/burstable/pod1234-ab")
    assert not in_cgroup(v1, "/kubepods/burstable/pod1234")  # a prefix of a name is not it
    assert not in_cgroup("0::/system.slice/kubelet.service\n", pod_cgroup(v2) or "")


def _in_cgroup(cgroup: Path, argv: list[str]) -> list[str]:
    """A command that joins `cgroup` and then execs `argv`."""
    return ["sh", "-c", f"echo $$ > {cgroup}/cgroup.procs && exec {shlex.join(argv)}"]


def test_only_the_pods_own_processes_are_measured_and_stopped(tmp_path: Path) -> None:
    if not os.access(CPU_HIERARCHY, os.W_OK):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CPU_HIERARCHY} is not writable (the suite runs as root)")
        pytest.skip(f"{CPU_HIERARCHY} is not writable")
    base = CPU_HIERARCHY / f"throttledjob-test-{uuid.uuid4().hex[:8]}"
    ours, theirs = base / "kubepods" / "podours", base / "kubepods" / "podtheirs"
    groups = [ours / "sidecar", ours / "work", theirs / "work"]
    for g in groups:
        g.mkdir(parents=True)
    policy = tmp_path / "policy.yaml"
    policy.write_text("targets: {cpu: {peak: 0.3}}\nenforcement: Signals\nmaxSlowdown: 20\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    port = free_port()
    work = [*HUNGRY, "--workers", "1", "--units", "100000", "--inline"]
    started: list[subprocess.Popen] = []
    try:
        mine = subprocess.Popen(_in_cgroup(ours / "work", work))
        foreign = subprocess.Popen(_in_cgroup(theirs / "work", work))
        started += [mine, foreign]
        sidecar = subprocess.Popen(_in_cgroup(ours / "sidecar", [
            str(VENV_BIN / "throttledjob"), "sidecar", "--policy", str(policy),
            "--shared-dir", str(shared), "--host", "127.0.0.1", "--port", str(port)]))
        started.append(sidecar)
        wait_for(lambda: (get_json(f"http://127.0.0.1:{port}/status") or {}).get("observed"),
                 timeout=30, what="the sidecar's first status")
        # Sample both for 3 s: ours is cycled through SIGSTOP, theirs never stopped.
        seen: dict[int, set[str]] = {mine.pid: set(), foreign.pid: set()}
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            for pid in seen:
                seen[pid].add(psutil.Process(pid).status())
            time.sleep(0.005)
        assert psutil.STATUS_STOPPED in seen[mine.pid], seen[mine.pid]
        assert psutil.STATUS_STOPPED not in seen[foreign.pid], seen[foreign.pid]
        status = get_json(f"http://127.0.0.1:{port}/status")
        assert status["telemetry"]["processes"] == 1, status["telemetry"]  # sh exec'd: one
    finally:
        for p in reversed(started):
            stop(p)
        for g in [*groups, ours, theirs, base / "kubepods", base]:
            with contextlib.suppress(OSError):
                g.rmdir()
