"""The cgroupfs readers (sidecar/cpu/cgroups/fs.py) on this machine's own /proc: which cgroups
a process is in, and whether a path is at or under a cgroup."""

from __future__ import annotations

from throttledjob.sidecar.cpu.cgroups.fs import cgroup_of, in_cgroup, pod_cgroup


def test_cgroup_of_reads_this_machines_proc(spawn):
    own = cgroup_of("self")
    assert own is not None and own.strip()
    for line in own.splitlines():
        hierarchy, _controllers, path = line.split(":", 2)
        assert hierarchy.isdigit() and path.startswith("/")
    child = spawn(["sleep", "60"])
    assert cgroup_of(child.pid) == own  # a child is born in its parent's cgroups
    gone = spawn(["true"])
    gone.wait()
    assert cgroup_of(gone.pid) is None


def test_in_cgroup_on_real_paths():
    own = cgroup_of("self")
    path = own.splitlines()[0].split(":", 2)[2].strip()
    assert in_cgroup(own, path)
    if path != "/":
        parent = path.rsplit("/", 1)[0] or "/"
        assert parent == "/" or in_cgroup(own, parent)
        assert not in_cgroup(own, path + "x")  # a longer name is another cgroup
    scope = pod_cgroup(own)
    assert scope is None or in_cgroup(own, scope)
