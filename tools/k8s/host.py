"""What this machine offers the test cluster: its cgroup hierarchies, free ports, a command
runner and the build cache. Stdlib only."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    """Where built binaries and images are kept between runs (THROTTLEDJOB_CACHE)."""
    return Path(os.environ.get("THROTTLEDJOB_CACHE", Path.home() / ".cache/throttledjob"))


def versions() -> dict[str, str]:
    """The pinned versions of everything the cluster builds (tools/k8s/versions.env, and
    versions-batch.env for the batch components built from modules of their own)."""
    out = {}
    for name in ("versions.env", "versions-batch.env"):
        for line in (Path(__file__).resolve().parent / name).read_text().splitlines():
            if "=" in line and not line.lstrip().startswith("#"):
                key, value = line.split("=", 1)
                out[key.strip()] = value.strip()
    return out


def cgroup_mounts() -> list[Path]:
    """Every cgroup hierarchy (v1 controllers and the unified one beside them)."""
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, fstype, *_ = line.split()
        if fstype in ("cgroup", "cgroup2"):
            out.append(Path(point))
    return out


def cpu_mount() -> Path | None:
    """The cgroup v1 cpu controller's hierarchy, where the machine has one."""
    return next((m for m in cgroup_mounts()
                 if "cpu" in m.name.split(",") and (m / "cpu.shares").exists()), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def run(*cmd: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    """`cmd` to its end, output captured; a failure raises with the output's tail."""
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}\n"
                           f"{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return proc
