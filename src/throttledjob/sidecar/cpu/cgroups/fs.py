"""cgroupfs: the one place cgroup paths and files are parsed, read and written.

Which cgroups a process is in (/proc/PID/cgroup), where the cgroup hierarchies are
mounted (/proc/PID/mountinfo), the directory of a cgroup under its mount, the pod a
container's cgroup belongs to, and the CPU quota files (v2 `cpu.max`, v1
`cpu.cfs_quota_us` + `cpu.cfs_period_us`). Parsing is pure; the readers and writers
are thin.
"""

from __future__ import annotations

import errno
import os


def cgroup_of(pid: int | str) -> str | None:
    """The text of /proc/PID/cgroup, or None when the process is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return f.read()
    except OSError:
        return None


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """{controllers: path} from /proc/PID/cgroup ("" is the v2 hierarchy)."""
    out = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) == 3:
            out[parts[1]] = parts[2]
    return out


def _cgroup_paths(cgroup_text: str | None) -> list[str]:
    """The path of each hierarchy in a /proc/PID/cgroup text ("ID:CONTROLLERS:PATH")."""
    return [line.split(":", 2)[-1].strip() for line in (cgroup_text or "").splitlines()]


def pod_cgroup(cgroup_text: str | None) -> str | None:
    """The pod-level cgroup of a container's process, from its /proc/PID/cgroup: the
    nearest ancestor named for the pod ("pod<uid>" with cgroupfs, "...-pod<uid>.slice"
    with systemd), on any hierarchy. None outside a pod (e.g. "/")."""
    for path in _cgroup_paths(cgroup_text):
        parts = path.split("/")
        for i in range(len(parts) - 1, 0, -1):
            if parts[i].startswith("pod") or "-pod" in parts[i]:
                return "/".join(parts[:i + 1])
    return None


def in_cgroup(cgroup_text: str | None, prefix: str) -> bool:
    """Whether any hierarchy's path in `cgroup_text` is `prefix` or below it."""
    return any(path == prefix or path.startswith(prefix + "/")
               for path in _cgroup_paths(cgroup_text))


def parse_mountinfo(text: str) -> list[tuple[str, str, str, set[str]]]:
    """(root, mount point, fstype, super options) of each cgroup mount in mountinfo."""
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or not tail[0].startswith("cgroup"):
            continue
        out.append((_unescape(fields[3]), _unescape(fields[4]), tail[0],
                    set(tail[2].split(","))))
    return out


def _unescape(field_: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal (\040 ...).
    return field_.encode().decode("unicode_escape") if "\\" in field_ else field_


def cgroup_dir(root: str, mount_root: str, mount_point: str, path: str) -> str | None:
    """The directory of cgroup `path` under a mount of the hierarchy at `mount_root`.

    Inside a container without a cgroup namespace, the mount's root is the container's
    cgroup and /proc/self/cgroup names it in full: strip the mount's root.
    """
    rel = os.path.relpath(path, mount_root) if mount_root != "/" else path.lstrip("/")
    if rel.startswith(".."):
        return None
    return os.path.normpath(os.path.join(under(root, mount_point), "" if rel == "." else rel))


def under(root: str, path: str) -> str:
    """`path` under `root` (tests point `root` at a tree mimicking cgroupfs)."""
    return os.path.join(root, path.lstrip("/"))


def read_limit(path: str) -> tuple[float | None, float]:
    """(quota, period) of a cpu cgroup directory, seconds; quota None: unlimited."""
    try:
        with open(os.path.join(path, "cpu.max")) as f:  # v2: "max 100000", "50000 100000"
            quota, period = f.read().split()
        return (None if quota == "max" else int(quota) / 1e6), int(period) / 1e6
    except FileNotFoundError:
        pass
    with open(os.path.join(path, "cpu.cfs_quota_us")) as f:
        quota_us = int(f.read())
    with open(os.path.join(path, "cpu.cfs_period_us")) as f:
        period_us = int(f.read())
    return (None if quota_us < 0 else quota_us / 1e6), period_us / 1e6


def write_quota(version: int, path: str, quota_us: int | None, period_us: int) -> None:
    """Set the quota of the cgroup at `path` (None: unlimited); v1's period is not
    written here (it is set once, when the cgroup is made)."""
    if version == 2:
        write(os.path.join(path, "cpu.max"),
              f"{'max' if quota_us is None else quota_us} {period_us}")
    else:
        write(os.path.join(path, "cpu.cfs_quota_us"), str(-1 if quota_us is None else quota_us))


def write(path: str, text: str) -> None:
    # One write() per value: cgroupfs parses each write on its own, and buffered writes
    # of several pids would be merged into one that the kernel refuses.
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def read_words(path: str) -> list[str]:
    """The whitespace-separated words of a cgroup file (pids, controllers); [] when it
    cannot be read."""
    try:
        with open(path) as f:
            return f.read().split()
    except OSError:
        return []


def not_writable(directory: str, filename: str) -> str | None:
    """Why `directory` does not take a child and `filename` a write (None: it does)."""
    for path, mode in ((directory, os.W_OK | os.X_OK), (os.path.join(directory, filename),
                                                        os.W_OK)):
        if not os.access(path, mode):
            err = errno.EROFS if _read_only(path) else errno.EACCES
            return os.strerror(err)
    return None


def _read_only(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def error_text(e: OSError) -> str:
    """An OSError as a reason for a report: the kernel's words, without the path."""
    return e.strerror or str(e)
