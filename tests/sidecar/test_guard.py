"""The guard: a sidecar that dies inside a stop leaves the workload stopped no longer than
the stop it announced (its lease), plus the guard's slack and poll.

Real processes, real signals, a real `throttledjob sidecar` SIGKILLed while it holds the
workload stopped, and a real `throttledjob guard` beside it, as in a pod.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from testing.helpers import wait_for
from testing.paths import VENV_BIN
from testing.processes import stopped
from testing.workloads import LONG, tree
from throttledjob.sidecar.cpu.enforcer import SignalEnforcer
from throttledjob.sidecar.cpu.guard import (
    LATE_SECONDS,
    POLL_SECONDS,
    SLACK_SECONDS,
    Guard,
    held,
    run_guard,
)
from throttledjob.sidecar.cpu.lease import LeaseWriter, StopLease, lease_path, read_lease
from throttledjob.sidecar.cpu.processes import ProcessTree

# The longest stop the enforcer makes, then the guard's slack and one poll: the bound
# docs/reliability.md states for a dead sidecar's stop. On this shared 2-core machine a
# process woken on time may still wait for a core: 0.1 s more for the scheduler (the
# measured worst is printed by the test).
MAX_STOP = SignalEnforcer(ProcessTree(root_pid=os.getpid())).max_stop_seconds
BOUND = MAX_STOP + SLACK_SECONDS + POLL_SECONDS
SCHEDULER = 0.1


@pytest.fixture
def sleeper():
    """A process that does nothing, for the test to stop; killed after."""
    p = subprocess.Popen(["sleep", "600"])
    yield p
    p.kill()
    p.wait()


def guard_thread(path: str):
    stop = threading.Event()
    t = threading.Thread(target=lambda: run_guard(os.path.dirname(path), stop), daemon=True)
    t.start()
    return stop, t


def write_lease(path: str, lease: StopLease) -> None:
    """One lease, as a sidecar just started writes its first (over whatever is there)."""
    writer = LeaseWriter(path)
    writer.write(lease)
    writer.close()


def test_a_lease_round_trips_and_junk_is_no_lease(tmp_path) -> None:
    path = lease_path(str(tmp_path))
    assert read_lease(path) is None  # none written
    writer = LeaseWriter(path)
    writer.write(StopLease(12.5, (7, 8, 1234567)))
    assert read_lease(path) == StopLease(12.5, (7, 8, 1234567))
    writer.write(StopLease(13.25, (7,)))  # shorter: the rest is blanked
    assert read_lease(path) == StopLease(13.25, (7,))
    writer.close()
    write_lease(path, StopLease(14.0, ()))  # a new writer over a longer line
    assert read_lease(path) == StopLease(14.0, ())
    # A write caught half done (the SEQs differ), and what the workload may write in a
    # directory it shares: no lease.
    for junk in ("3 14.5 7,8 2", "1 soon 7 1", "1 14.5 1 1", "1 nan 7 1", "1 14.5 7",
                 "", "not a lease at all"):
        Path(path).write_text(junk)
        assert read_lease(path) is None, junk
    os.unlink(path)
    os.mkfifo(path)  # a FIFO must not block the guard
    assert read_lease(path) is None


def test_a_lease_file_removed_or_replaced_is_written_anew_and_never_blocks(tmp_path) -> None:
    """The shared directory is the workload's too: a lease file it removes (tidying up)
    was still written, to the removed file, and the guard saw none; a FIFO put in its
    place blocked the sidecar in its open. Written anew where the guard reads, or
    refused (OSError: the sidecar then stops nothing)."""
    path = lease_path(str(tmp_path))
    writer = LeaseWriter(path)
    writer.write(StopLease(1.0, (7,)))
    os.unlink(path)
    writer.write(StopLease(2.0, (7,)))
    assert read_lease(path) == StopLease(2.0, (7,))
    os.unlink(path)
    os.mkfifo(path)
    began = time.monotonic()
    with pytest.raises(OSError):
        writer.write(StopLease(3.0, (7,)))
    assert time.monotonic() - began < 1.0
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)   # a FIFO with a reader opens
    try:
        with pytest.raises(OSError, match="not a regular file"):
            LeaseWriter(path).write(StopLease(4.0, (7,)))
    finally:
        os.close(reader)
    writer.close()


def test_the_guard_resumes_a_stop_when_its_lease_ends_and_not_before(tmp_path,
                                                                     sleeper) -> None:
    """A lease of 0.4 s whose writer never resumes: still stopped while the lease runs
    (a live sidecar's stop is not cut short), running again within the bound after."""
    path = lease_path(str(tmp_path))
    stop, t = guard_thread(path)
    try:
        until = time.monotonic() + 0.4
        write_lease(path, StopLease(until, (sleeper.pid,)))
        os.kill(sleeper.pid, signal.SIGSTOP)
        wait_for(lambda: stopped(sleeper.pid), interval=0.001, what="the process stopped")
        while time.monotonic() < until - 0.05:
            assert stopped(sleeper.pid), "resumed before the lease ended"
            time.sleep(0.01)
        wait_for(lambda: not stopped(sleeper.pid), timeout=5, interval=0.002,
                 what="the guard resuming the stopped process")
        late = time.monotonic() - until
        print(f"resumed {late:.3f} s after the lease ended")
        assert late <= SLACK_SECONDS + POLL_SECONDS + SCHEDULER, late
    finally:
        stop.set()
        t.join(5)


def test_a_renewed_lease_is_not_cut_short(tmp_path, sleeper) -> None:
    """A sidecar that is late but alive writes a new lease before its next stop: the
    guard waits for the new one."""
    path = lease_path(str(tmp_path))
    os.kill(sleeper.pid, signal.SIGSTOP)
    wait_for(lambda: stopped(sleeper.pid), interval=0.001, what="the process stopped")
    clock = [100.0]
    guard = Guard(path, clock=lambda: clock[0])
    write_lease(path, StopLease(100.1, (sleeper.pid,)))
    assert guard.step() == POLL_SECONDS  # not due yet: looks again within a poll
    assert stopped(sleeper.pid)
    write_lease(path, StopLease(100.5, (sleeper.pid,)))  # renewed before it fell due
    clock[0] = 100.2
    guard.step()
    assert stopped(sleeper.pid) and guard.rescues == 0
    clock[0] = 100.6
    guard.step()
    assert not stopped(sleeper.pid) and guard.rescues == 1
    assert guard.step() == POLL_SECONDS


def test_a_stop_landing_after_its_lease_fell_due_is_resumed_too(tmp_path, sleeper) -> None:
    """The sidecar wrote its lease, then was descheduled (a busy node) and sent its
    SIGSTOP after the lease had ended; killed then, nobody resumed it: the guard had
    looked at the lease once, found nothing stopped, and passed it by. It watches an
    overdue lease for LATE_SECONDS, then lets it be."""
    path = lease_path(str(tmp_path))
    clock = [100.0]
    guard = Guard(path, clock=lambda: clock[0])
    write_lease(path, StopLease(100.1, (sleeper.pid,)))
    clock[0] = 100.2
    guard.step()   # overdue, nothing stopped: nothing to do yet
    os.kill(sleeper.pid, signal.SIGSTOP)   # the late stop lands; the sidecar dies
    wait_for(lambda: stopped(sleeper.pid), interval=0.001, what="the process stopped")
    clock[0] = 100.4
    guard.step()
    assert not stopped(sleeper.pid) and guard.rescues == 1
    clock[0] = 100.1 + SLACK_SECONDS + LATE_SECONDS
    guard.step()   # the window ends: the lease is passed by
    os.kill(sleeper.pid, signal.SIGSTOP)   # the workload's own stop, much later
    wait_for(lambda: stopped(sleeper.pid), interval=0.001, what="the process stopped")
    clock[0] += 5
    guard.step()
    assert stopped(sleeper.pid) and guard.rescues == 1
    os.kill(sleeper.pid, signal.SIGCONT)


@pytest.fixture
def frozen(sleeper, tmp_path):
    """`sleeper` in a frozen cgroup (v1 freezer): it does not run, so a signal sent to it
    stays pending, as for a process waiting for a CPU on a busy machine. Thawed after."""
    freezer = Path("/sys/fs/cgroup/freezer")
    if not os.access(freezer, os.W_OK):
        if os.environ.get("CI"):
            pytest.fail("no writable cgroup v1 freezer (root, as `make test` runs)")
        pytest.skip("no writable cgroup v1 freezer here")
    cgroup = freezer / f"throttledjob-test-{os.getpid()}"
    cgroup.mkdir()
    try:
        (cgroup / "cgroup.procs").write_text(str(sleeper.pid))
        (cgroup / "freezer.state").write_text("FROZEN")
        wait_for(lambda: (cgroup / "freezer.state").read_text().strip() == "FROZEN",
                 what="the cgroup frozen")
        yield cgroup
    finally:
        (cgroup / "freezer.state").write_text("THAWED")
        (freezer / "cgroup.procs").write_text(str(sleeper.pid))
        cgroup.rmdir()


@pytest.mark.usefixtures("frozen")
def test_a_stop_sent_but_not_yet_taken_is_resumed_too(tmp_path, sleeper) -> None:
    """A SIGSTOP is taken when its process next runs. One that cannot run yet when the
    lease falls due is not stopped then, and would stop for good after the guard looked:
    the guard sends SIGCONT to a pending stop too, which discards it."""
    path = lease_path(str(tmp_path))
    os.kill(sleeper.pid, signal.SIGSTOP)  # as a sidecar does just before it dies
    assert not stopped(sleeper.pid) and held(sleeper.pid)
    write_lease(path, StopLease(time.monotonic() - 1.0, (sleeper.pid,)))
    guard = Guard(path)
    guard.step()
    assert guard.rescues == 1
    assert not held(sleeper.pid)  # discarded: it will run when it can


def sidecar_cmd(policy, shared, root_pid: int) -> list[str]:
    return [str(VENV_BIN / "throttledjob"), "sidecar", "--policy", str(policy),
            "--shared-dir", str(shared), "--host", "127.0.0.1", "--port", "0",
            "--root-pid", str(root_pid)]


def kill_inside_a_stop(sidecar: subprocess.Popen, pids: list[int]) -> float:
    """SIGKILL the sidecar at a moment it holds the workload stopped; returns when."""
    deadline = time.monotonic() + 30
    while not any(stopped(p) for p in pids):
        assert time.monotonic() < deadline, "the sidecar never stopped the workload"
        assert sidecar.poll() is None, "the sidecar exited"
        time.sleep(0.001)
    sidecar.kill()
    killed = time.monotonic()
    sidecar.wait()
    return killed


def test_five_sidecar_deaths_inside_a_stop_each_leave_it_stopped_within_the_bound(
        tmp_path, workload) -> None:
    """Signals hold two busy processes at 0.2 of 2 cores: they are stopped most of the
    time. The sidecar is SIGKILLed inside a stop five times in a row (restarted after
    each, as the kubelet would): each time the guard resumes the workload within the
    bound. Without the guard (first) the same death leaves it stopped."""
    proc = workload(*LONG)
    pids = wait_for(lambda: len(tree(proc.pid)) == 3 and tree(proc.pid), what="workers")
    policy = tmp_path / "policy.yaml"
    policy.write_text("targets: {cpu: {peak: 200m}}\nmaxSlowdown: 8\nenforcement: Signals\n")
    shared = tmp_path / "shared"
    shared.mkdir()

    def start_sidecar() -> subprocess.Popen:
        return subprocess.Popen(sidecar_cmd(policy, shared, proc.pid),
                                stderr=subprocess.DEVNULL)

    # The control: no guard, and the sidecar's death leaves the workload stopped.
    sidecar = start_sidecar()
    kill_inside_a_stop(sidecar, pids)
    time.sleep(BOUND + 0.3)
    assert any(stopped(p) for p in pids), "nothing left stopped: the test proves nothing"

    guard = subprocess.Popen([str(VENV_BIN / "throttledjob"), "guard", "--shared-dir",
                              str(shared)], stderr=subprocess.PIPE, text=True)
    try:
        # The lease it finds ended long ago: one poll, and the workload runs.
        wait_for(lambda: not any(stopped(p) for p in pids), timeout=5, interval=0.002,
                 what="the guard resuming a stop left by a sidecar dead before it started")
        held = []
        for _ in range(5):
            sidecar = start_sidecar()
            killed = kill_inside_a_stop(sidecar, pids)
            lease = read_lease(lease_path(str(shared)))
            while any(stopped(p) for p in pids):
                assert time.monotonic() < killed + 5, (
                    f"still stopped 5 s after the kill: {pids} "
                    f"{[p for p in pids if stopped(p)]} stopped; lease at the kill {lease}, "
                    f"now {read_lease(lease_path(str(shared)))}, monotonic "
                    f"{time.monotonic()}; guard alive: {guard.poll() is None}")
                time.sleep(0.001)
            resumed = time.monotonic()
            assert lease is not None and set(lease.pids) >= set(pids[1:]), lease
            held.append((resumed - killed, resumed - lease.until))
        print("stopped after the kill (s):", [round(h, 3) for h, _ in held],
              "past the lease's end:", [round(p, 3) for _, p in held])
        assert max(h for h, _ in held) <= BOUND + SCHEDULER, held
        assert max(p for _, p in held) <= SLACK_SECONDS + POLL_SECONDS + SCHEDULER, held
        assert statistics.median(h for h, _ in held) <= BOUND, held
        assert proc.poll() is None  # the workload runs on
    finally:
        guard.send_signal(signal.SIGTERM)
        assert guard.wait(timeout=10) == 0
    assert "resumed" in guard.stderr.read()  # it says what it did
    assert not any(stopped(p) for p in pids)


def test_the_sidecar_never_counts_the_guard_as_the_workload(tmp_path) -> None:
    """In a pod the guard shares the workload's process namespace and cgroup: counted as
    workload it would be stopped with it (it was, on the real node), and its container,
    which has no CPU limit, turned the sidecar's Quota into signals. Run as the pod runs
    it (`tj-guard`, under a shell as in a container: the sidecar's own children are never
    the workload), it has its name from its first instruction on."""
    guard_cmd = f"{VENV_BIN / 'tj-guard'} --shared-dir {tmp_path}"
    shell = subprocess.Popen(["sh", "-c", f"sleep 600 & {guard_cmd}; wait"],
                             start_new_session=True)
    try:
        seen: set[str] = set()
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # every name the guard's process had
            for kid in psutil.Process(shell.pid).children():
                with contextlib.suppress(psutil.Error):
                    seen.add(kid.name())
            time.sleep(0.001)
        assert seen == {"sh", "sleep", "tj-guard"} or seen == {"sleep", "tj-guard"}, seen
        sleeper, guard = sorted(psutil.Process(shell.pid).children(), key=lambda k: k.name())
        everyone = ProcessTree()  # the namespace's processes, as a pod's sidecar sees them
        assert sleeper.pid in everyone.pids() and guard.pid not in everyone.pids()
    finally:
        os.killpg(shell.pid, signal.SIGTERM)
        shell.wait(timeout=10)
