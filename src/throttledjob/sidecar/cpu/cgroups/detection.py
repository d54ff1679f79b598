"""Whether this machine lets the run put a CPU quota on a cgroup of its own, detected,
never assumed: cgroup v2 `cpu.max` where the cpu controller is delegated to a writable
subtree, else cgroup v1 `cpu.cfs_quota_us` under the cpu controller's mount. The answer
is a backend (`local_quota.QuotaBackend`) or a one-line reason, so the run's report can
say which enforcer ran and why.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from .fs import (
    cgroup_dir,
    error_text,
    not_writable,
    parse_mountinfo,
    parse_proc_cgroup,
    read_words,
    under,
    write_quota,
)
from .local_quota import PERIOD_US, PREFIX, QuotaBackend


@dataclass(frozen=True)
class Detection:
    """The usable backend, or None and why not (one line)."""

    backend: QuotaBackend | None
    reason: str

    def __bool__(self) -> bool:
        return self.backend is not None


def detect(root: str = "/", pid: int | str = "self", probe: bool = True) -> Detection:
    """Find a cgroup this process may put a CPU quota on, for a child of `pid`'s cgroup.

    `root` prefixes every path read (/proc/PID/cgroup, /proc/PID/mountinfo and the mount
    points they name), so tests can point it at a directory tree mimicking cgroupfs.
    With `probe`, a throwaway child cgroup is made and removed: only the kernel knows
    whether a mkdir or a quota write is allowed (read-only mounts, user namespaces,
    controllers bound elsewhere), and a reason taken from the real error beats a guess.
    Never raises.
    """
    try:
        with open(under(root, f"/proc/{pid}/cgroup")) as f:
            own = parse_proc_cgroup(f.read())
        with open(under(root, f"/proc/{pid}/mountinfo")) as f:
            mounts = parse_mountinfo(f.read())
    except OSError as e:
        return Detection(None, f"cannot read the process's cgroups: {error_text(e)}")
    reasons = []
    # v2 first: on a hybrid machine the cpu controller is in at most one of the two, and
    # the v2 candidate says so ("no cpu controller delegated") before v1 is tried.
    for version in (2, 1):
        found = _candidate(root, version, own, mounts)
        if isinstance(found, str):
            reasons.append(found)
            continue
        if probe:
            why = _probe(found)
            if why:
                reasons.append(why)
                continue
        # Why the other version was passed over belongs in the report too.
        passed = f" ({'; '.join(reasons)})" if reasons else ""
        return Detection(found, found.describe() + passed)
    return Detection(None, "; ".join(reasons))


def _candidate(root: str, version: int, own: dict[str, str],
               mounts: list[tuple[str, str, str, set[str]]]) -> QuotaBackend | str:
    """The backend for one cgroup version, or why not (without writing anything)."""
    if version == 2:
        mount = next(((mroot, point) for mroot, point, fstype, _ in mounts
                      if fstype == "cgroup2"), None)
        path = own.get("")
        name = "cgroup v2"
        if mount is None or path is None:
            return f"{name}: not mounted" if mount is None else f"{name}: process not in it"
    else:
        mount = next(((mroot, point) for mroot, point, fstype, opts in mounts
                      if fstype == "cgroup" and "cpu" in opts), None)
        path = next((p for ctrls, p in own.items() if "cpu" in ctrls.split(",")), None)
        name = "cgroup v1 cpu controller"
        if mount is None or path is None:
            return f"{name}: not mounted" if mount is None else f"{name}: process not in it"
    home = cgroup_dir(root, *mount, path)
    if home is None:
        return f"{name}: the process's cgroup {path} is outside the mount ({mount[0]})"
    if not os.path.isdir(home):
        return f"{name}: {home} missing"
    if version == 1:
        if not os.path.exists(os.path.join(home, "cpu.cfs_quota_us")):
            return f"{name}: no cpu.cfs_quota_us in {home} (kernel without CFS bandwidth)"
        why = not_writable(home, "cgroup.procs")
        return f"{name} not writable: {why}" if why else QuotaBackend(1, home, home)
    # v2: a child needs `cpu` in its parent's subtree_control. The process's own cgroup
    # holds processes, so (no internal processes rule) it can only have it when it is the
    # root; otherwise the child is a sibling in the delegated parent, and moving between
    # siblings needs write access to the parent's cgroup.procs (their common ancestor).
    for parent in (home, os.path.dirname(home)):
        if not parent.startswith(under(root, mount[1])):
            break
        if "cpu" in read_words(os.path.join(parent, "cgroup.subtree_control")):
            why = not_writable(parent, "cgroup.procs")
            if why:
                return f"{name}: cpu delegated at {parent} but not writable: {why}"
            return QuotaBackend(2, parent, home)
    return f"{name}: no cpu controller delegated (cpu not in cgroup.subtree_control of {home})"


def _probe(backend: QuotaBackend) -> str | None:
    """Make, configure and remove a throwaway child; the error, if any, as a reason."""
    probe = os.path.join(backend.parent, f"{PREFIX}probe-{os.getpid()}")
    try:
        os.mkdir(probe)
    except FileExistsError:
        pass
    except OSError as e:
        return f"{_label(backend)} not writable: {error_text(e)}"
    try:
        write_quota(backend.version, probe, None, PERIOD_US)
        return None
    except OSError as e:
        return f"{_label(backend)}: cannot set a quota: {error_text(e)}"
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe)


def _label(backend: QuotaBackend) -> str:
    return "cgroup v2" if backend.version == 2 else "cgroup v1 cpu controller"
