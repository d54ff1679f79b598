"""The one control loop (sidecar/loop.py) and its fail-open rule, on a real process."""

from __future__ import annotations

import os
import signal
import sys

from testing.helpers import wait_for
from testing.processes import stopped
from throttledjob.contracts.policy import Enforcement, Policy
from throttledjob.sidecar.agent import Agent
from throttledjob.sidecar.cpu.processes import ProcessTree
from throttledjob.sidecar.loop import run_loop
from throttledjob.sidecar.record import CycleResult


class FlakyTree(ProcessTree):
    """A real process tree whose refresh fails while `failing` (a bug, a /proc race)."""

    failing = 0

    def refresh(self) -> None:
        if self.failing:
            self.failing -= 1
            raise RuntimeError("a cycle that breaks")
        super().refresh()


class Recorder:
    """A host that runs `cycles` intervals and records what the loop told it."""

    def __init__(self, cycles: int, tree: FlakyTree, pid: int) -> None:
        self.left, self.tree, self.pid = cycles, tree, pid
        self.events: list[str] = []

    def wait(self, timeout: float) -> bool:
        self.left -= 1
        return self.left < 0

    def before_cycle(self) -> None:
        if self.left == 2:  # the workload is found stopped, and the next cycle breaks
            os.kill(self.pid, signal.SIGSTOP)
            wait_for(lambda: stopped(self.pid))
            self.tree.failing = 1

    def after_cycle(self, result: CycleResult) -> None:
        self.events.append(f"ok {stopped(self.pid)}")

    def cycle_failed(self, error: Exception, in_a_row: int) -> None:
        self.events.append(f"failed {in_a_row} {stopped(self.pid)}")


def test_a_failed_cycle_releases_the_workload_and_the_next_one_runs(spawn, tmp_path) -> None:
    child = spawn([sys.executable, "-c", "import time; time.sleep(60)"])
    tree = FlakyTree(root_pid=child.pid)
    policy = Policy(cpu_peak_cores=1.0, enforcement=Enforcement.COOPERATIVE,
                    interval_seconds=0.05)
    agent = Agent(policy, tree, str(tmp_path))
    agent.start()
    host = Recorder(4, tree, child.pid)
    run_loop(agent, host)
    # The failure resumed the stopped workload before the host heard of it; the loop
    # went on cycling (in_a_row restarts after a good cycle).
    assert host.events == ["ok False", "failed 1 False", "ok False", "ok False"]
    assert agent.result.last.error is None
    agent.close()
