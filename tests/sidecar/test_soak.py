"""Sidecar soak: 100,000 control cycles with 8 simulated GPUs, served metrics included.

Memory and open file descriptors must not grow: a sidecar runs for the life of a job,
and a leak of a few bytes a cycle is a dead sidecar after a week.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import urllib.request

import psutil

from throttledjob.contracts.policy import Policy
from throttledjob.gpu.fake import FakeGpuBackend
from throttledjob.sidecar.agent import Agent
from throttledjob.sidecar.cpu.processes import ProcessTree
from throttledjob.sidecar.exporter import Exporter
from throttledjob.sidecar.gpu_agent import GpuAgent
from throttledjob.sidecar.gpu_simulate import follow

CYCLES = 100_000
WARM_UP = 10_000


class Clock:
    """One control interval (1 s) passes per cycle, so every cycle makes a sample."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def test_100k_cycles_leak_neither_memory_nor_descriptors(tmp_path):
    # The shared emptyDir of a pod is often memory-backed; tmpfs keeps 100k renames quick.
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else str(tmp_path)
    shared = tempfile.mkdtemp(dir=shm)
    workload = subprocess.Popen(["sleep", "600"])
    policy = Policy(cpu_peak_cores=1.0, gpu_peak_utilization_percent=70,
                    gpu_peak_power_watts=250, enforcement="cooperative")
    gpu = GpuAgent(FakeGpuBackend(8, "sawtooth"), policy)
    follow(gpu)
    agent = Agent(policy, ProcessTree(root_pid=workload.pid), str(shared), gpu=gpu,
                  clock=Clock())
    exporter = Exporter("127.0.0.1", 0).attach(agent, "psutil").start()
    me = psutil.Process()
    try:
        agent.start()
        for i in range(CYCLES):
            agent.cycle()
            if i == WARM_UP:
                rss, fds = me.memory_info().rss, me.num_fds()
            if i % 10_000 == 0:  # scrape now and then, as Prometheus would
                with urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics") as r:
                    assert b"throttledjob_gpu_power_watts" in r.read()
        grown = me.memory_info().rss - rss
        assert grown < 2 * 1024 * 1024, f"resident memory grew {grown / 1024:.0f} KiB"
        assert me.num_fds() <= fds  # none grew (a scrape's socket may close meanwhile)
        assert agent.result.cpu.count >= CYCLES - 1
    finally:
        exporter.close()
        agent.close()
        workload.kill()
        workload.wait()
        shutil.rmtree(shared, ignore_errors=True)
