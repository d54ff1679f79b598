"""Go for the test cluster's builds (tools/k8s/build.sh, batch.py, images.py): the
machine's `go` where there is one (Go fetches a newer toolchain itself when a module asks
for one), else the pinned release (GO_VERSION) from the Go module proxy, which serves every Go
release as the module `golang.org/toolchain`, unpacked once into the build cache.

    python3 -m tools.go_toolchain      # prints the directory holding `go`

Stdlib only: it runs before anything is installed.
"""

from __future__ import annotations

import os
import platform
import shutil
import stat
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from tools.k8s.host import cache_dir

MODULE = "golang.org/toolchain"
# The release fetched where the machine has no `go`: the cluster's module graph
# (tools/k8s/binaries/go.mod) needs 1.26.7 or later. Not in versions.env, whose every
# change empties the built binaries' cache (build.sh): which Go built them does not.
GO_VERSION = "1.26.8"


def go_dir(environ: os._Environ | dict[str, str] = os.environ) -> Path:
    """The directory of a `go` to use: PATH's, else the pinned toolchain (fetched once)."""
    found = shutil.which("go", path=environ.get("PATH"))
    if found:
        return Path(found).parent
    return fetch(GO_VERSION, environ.get("GOPROXY", ""))


def _arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def fetch(version: str, goproxy: str = "", dest: Path | None = None) -> Path:
    """go`version` for this machine, from the first proxy of GOPROXY (default
    proxy.golang.org), unpacked under `dest` (default: the build cache); returns its bin
    directory. A copy already unpacked is used as it is."""
    dest = dest or cache_dir() / "go"
    home = dest / f"go{version}"
    if (home / "bin" / "go").exists():
        return home / "bin"
    proxy = next((p for p in goproxy.split(",") if p.startswith(("http://", "https://"))),
                 "https://proxy.golang.org").rstrip("/")
    tag = f"v0.0.1-go{version}.linux-{_arch()}"
    url = f"{proxy}/{MODULE}/@v/{tag}.zip"
    sys.stderr.write(f"tools.go_toolchain: no go on PATH: fetching {url}\n")
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        archive = Path(tmp) / "go.zip"
        with urllib.request.urlopen(url, timeout=300) as r, archive.open("wb") as out:
            shutil.copyfileobj(r, out)
        prefix = f"{MODULE}@{tag}/"
        unpacked = Path(tmp) / "go"
        with zipfile.ZipFile(archive) as z:
            for member in z.infolist():
                if not member.filename.startswith(prefix) or member.is_dir():
                    continue
                target = unpacked / member.filename[len(prefix):]
                target.parent.mkdir(parents=True, exist_ok=True)
                with z.open(member) as src, target.open("wb") as out:
                    shutil.copyfileobj(src, out)
        # A module zip keeps no file modes: the commands are made executable, as the go
        # command does when it switches toolchains.
        for tool in [*(unpacked / "bin").iterdir(), *(unpacked / "pkg" / "tool").rglob("*")]:
            if tool.is_file():
                tool.chmod(tool.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        try:
            unpacked.rename(home)   # whole, or not there: a fetch cut short leaves nothing
        except OSError:
            if not (home / "bin" / "go").exists():   # not another fetch's, finished first
                raise
    return home / "bin"


if __name__ == "__main__":
    print(go_dir())
