"""ProcessTree and the /proc readers on real processes: children and grandchildren are
found, CPU time neither drops nor double counts when a member is reaped, signals reach
the members, and a tree scoped by a cgroup takes what is in it."""

from __future__ import annotations

import itertools
import os
import signal
import sys
import textwrap

import psutil

from testing.helpers import wait_for
from throttledjob.sidecar.cpu.cgroups.fs import cgroup_of
from throttledjob.sidecar.cpu.processes import ProcessTree, descendants, resume

# A root with a child, which has a child of its own: three generations of sleepers.
GENERATIONS = ["/bin/sh", "-c", 'sleep 60 & /bin/sh -c "sleep 60 & wait" & wait']


def test_the_tree_finds_children_and_grandchildren(spawn):
    root = spawn(GENERATIONS)
    tree = ProcessTree(root_pid=root.pid)

    def everyone() -> list[int]:
        tree.refresh()
        return tree.pids() if len(tree.pids()) == 4 else []

    pids = wait_for(everyone, what="root, its 2 children and a grandchild")
    expected = {root.pid, *(p.pid for p in psutil.Process(root.pid).children(recursive=True))}
    assert set(pids) == expected
    assert descendants(root.pid)[0] == root.pid and set(descendants(root.pid)) == expected
    assert tree.scoped


def test_its_own_process_is_never_a_member(spawn):
    child = spawn(["sleep", "60"])
    tree = ProcessTree(root_pid=os.getpid())
    assert os.getpid() not in tree.pids() and child.pid in tree.pids()


def test_cpu_time_does_not_drop_when_a_member_exits_and_is_reaped(spawn):
    # The root burns CPU in a child, reaps it, then sleeps: the child's time moves into the
    # root's children time, so the tree's total keeps rising through the exit.
    script = textwrap.dedent("""
        import os, time
        pid = os.fork()
        if pid == 0:
            end = time.process_time() + 0.1
            while time.process_time() < end:
                pass
            os._exit(0)
        os.waitpid(pid, 0)
        time.sleep(120)
    """)
    root = spawn([sys.executable, "-c", script])
    tree = ProcessTree(root_pid=root.pid)
    totals = []
    # /proc counts CPU time in clock ticks, sampled: the child's 0.1 s of process time
    # may read as a tick or two less (9 ticks of 10 ms was seen, run after run).
    tick = 1.0 / os.sysconf("SC_CLK_TCK")

    def reaped() -> bool:
        tree.refresh()
        totals.append(tree.cpu_seconds())
        return len(tree.pids()) == 1 and totals[-1] >= 0.1 - 2 * tick

    # Only 0.1 s of CPU: the machine may be shared and loaded.
    wait_for(reaped, timeout=120, interval=0.01, what="the child to burn 0.1 s and be reaped")
    assert all(b >= a - 2 * tick for a, b in itertools.pairwise(totals))
    # Counted once: the root's own time plus the child's 0.1 s, not twice that.
    own = psutil.Process(root.pid).cpu_times()
    assert totals[-1] < own.user + own.system + 0.1 + 0.05


def test_signal_reaches_the_members_and_skips_the_gone(spawn):
    child = spawn(["sleep", "60"])
    tree = ProcessTree(root_pid=child.pid)
    gone = spawn(["true"])
    gone.wait()
    try:
        assert tree.signal(signal.SIGSTOP, [child.pid, gone.pid]) == [child.pid]
        wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_STOPPED,
                 what="the child stopped")
    finally:
        resume([child.pid, gone.pid])  # never raises, the gone pid included
    wait_for(lambda: psutil.Process(child.pid).status() != psutil.STATUS_STOPPED,
             what="the child resumed")


def test_a_cgroup_scoped_tree_takes_grandchildren_but_not_its_own_helpers(spawn):
    # Scoped by our own cgroup: a direct child of this process is a helper of ours, but
    # what it starts is in the same cgroup and is the workload.
    path = cgroup_of("self").splitlines()[0].split(":", 2)[2].strip()
    root = spawn(["/bin/sh", "-c", "sleep 60 & wait"])
    grandchild = wait_for(lambda: psutil.Process(root.pid).children(), what="a grandchild")[0]
    tree = ProcessTree(pod_cgroup=path)
    assert tree.scoped
    assert grandchild.pid in tree.pids()
    assert root.pid not in tree.pids() and os.getpid() not in tree.pids()
