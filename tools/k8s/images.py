"""The images a real node runs, built on this machine and cached in
~/.cache/throttledjob/images (THROTTLEDJOB_CACHE): no container registry is reachable.

- the sandbox ("pause") image: tools/k8s/pause, a static Go binary, packed by hand as an
  OCI archive (one layer, one file);
- a Debian bookworm base with Debian's python3.11 (debootstrap), the local stand-in for
  the Dockerfile's python:3.11-slim-bookworm;
- the product image localhost/throttledjob:dev: the project's Dockerfile built by podman
  from that base (`--build-arg BASE=...`);
- a user's image with PyTorch, localhost/throttledjob-torch-train:dev
  (examples/pytorch/Dockerfile), the same way.

Each is an OCI archive the node loads with `ctr images import`. Stdlib only.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from tools.k8s.host import cache_dir, run

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PAUSE_IMAGE = "localhost/throttledjob-pause:1"
BASE_IMAGE = "localhost/throttledjob-base:bookworm"
PRODUCT_IMAGE = "localhost/throttledjob:dev"
TORCH_IMAGE = "localhost/throttledjob-torch-train:dev"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def pause_archive() -> Path:
    """The sandbox image as an OCI archive `ctr images import` reads (built once)."""
    src = HERE / "pause" / "main.go"
    key = hashlib.sha256(src.read_bytes()).hexdigest()[:12]
    out = cache_dir() / "images" / f"pause-{key}.oci.tar"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "pause"
        run("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(binary), str(src),
             cwd=src.parent, env={**os.environ, "CGO_ENABLED": "0"})
        # One layer holding /pause; mtime 0 so the same source gives the same digest.
        layer_tar = io.BytesIO()
        with tarfile.open(fileobj=layer_tar, mode="w") as t:
            info = t.gettarinfo(str(binary), arcname="pause")
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            t.addfile(info, binary.open("rb"))
        layer = gzip.compress(layer_tar.getvalue(), mtime=0)
        config = json.dumps({
            "architecture": "amd64", "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer_tar.getvalue())]},
        }).encode()
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": _digest(config), "size": len(config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": _digest(layer), "size": len(layer)}],
        }).encode()
        index = json.dumps({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": _digest(manifest), "size": len(manifest),
            "annotations": {"io.containerd.image.name": PAUSE_IMAGE,
                            "org.opencontainers.image.ref.name": PAUSE_IMAGE.split(":")[1]}}],
        }).encode()
        files = {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}', "index.json": index}
        for blob in (layer, config, manifest):
            files["blobs/sha256/" + _digest(blob).split(":")[1]] = blob
        tmp_out = out.with_suffix(".tmp")
        with tarfile.open(tmp_out, "w") as t:
            for name, data in files.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
        tmp_out.rename(out)
    return out


def _podman(*args: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    """podman with its storage in the cache, not /var/lib/containers: nothing of the
    machine's own, and the base image survives between runs."""
    store = cache_dir() / "images" / "podman"
    # The run root (locks, mounts of a build) is only for the build's time; podman refuses
    # one over 50 characters, which a cache under a long HOME gives: there, a short one in
    # the temporary directory, one per store. A store keeps the run root it was made with.
    runroot = store / "run"
    if len(str(runroot)) > 50:
        key = hashlib.sha256(str(store).encode()).hexdigest()[:8]
        runroot = Path(tempfile.gettempdir()) / f"tj-podman-{key}"
    return run("podman", "--root", str(store / "root"), "--runroot", str(runroot),
                "--storage-driver", "overlay", "--cgroup-manager", "cgroupfs",
                "--events-backend", "none", *args, check=check, **kw)


def base_image() -> None:
    """localhost/throttledjob-base:bookworm in podman's store: Debian bookworm minbase with
    Debian's python3.11 (what python:3.11-slim-bookworm is, minus its own build of Python),
    from debootstrap (about 80 s, once)."""
    tarball = cache_dir() / "images" / "base-bookworm-python3.tar"
    if not tarball.exists():
        tarball.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=tarball.parent) as tmp:
            rootfs = Path(tmp) / "rootfs"
            # python-is-python3: the Dockerfile calls `python`; python3-venv: ensurepip.
            run("debootstrap", "--variant=minbase",
                 "--include=python3,python3-venv,python-is-python3,ca-certificates",
                 "bookworm", str(rootfs), "http://deb.debian.org/debian", timeout=900)
            for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for p in (rootfs / junk).glob("*"):
                    if p.is_file():
                        p.unlink()
            run("tar", "-C", str(rootfs), "-cf", str(tarball.with_suffix(".tmp")), ".")
            tarball.with_suffix(".tmp").rename(tarball)
    if _podman("image", "exists", BASE_IMAGE, check=False).returncode == 0:
        return
    with tempfile.TemporaryDirectory(dir=tarball.parent) as tmp:
        # The image trusts what this machine trusts: where HTTPS goes through an
        # intercepting proxy, its CA is in the host's bundle only, and pip (which brings
        # its own bundle) must be told to use the system's, as the host's pip is.
        image_tar = Path(tmp) / "base.tar"
        extra = {"./etc/pip.conf": b"[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n"}
        host_ca = Path("/etc/ssl/certs/ca-certificates.crt")
        if host_ca.exists():
            extra["./etc/ssl/certs/ca-certificates.crt"] = host_ca.read_bytes()
        # A copy with those files replaced (podman refuses a layer naming a path twice).
        with tarfile.open(tarball) as src, tarfile.open(image_tar, "w") as dst:
            for member in src:
                if member.name not in extra:
                    dst.addfile(member, src.extractfile(member) if member.isfile() else None)
            for name, data in extra.items():
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o644
                dst.addfile(info, io.BytesIO(data))
        _podman("import", "--change", "ENV=LANG=C.UTF-8", "--change", 'CMD=["python3"]',
                str(image_tar), BASE_IMAGE)


def _context_hash(paths: list[Path]) -> str:
    """What an image is built from: its Dockerfile and the files it may copy."""
    h = hashlib.sha256()
    for p in paths:
        h.update(p.relative_to(ROOT).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:12]


def _build_archive(image: str, dockerfile: Path, context: Path, inputs: list[Path]) -> Path:
    """`image` built by podman from `dockerfile` on the local base, as an OCI archive in
    the cache; rebuilt when the Dockerfile or what it copies (`inputs`) changes."""
    stem = image.split("/")[-1].replace(":", "-")
    out = cache_dir() / "images" / f"{stem}-{_context_hash([dockerfile, *inputs])}.oci.tar"
    if out.exists():
        return out
    base_image()
    # --network host: pip in the build reaches PyPI as this machine does. The ulimits:
    # podman asks for more open files than root may have here (no CAP_SYS_RESOURCE, hard
    # limit below podman's default).
    _podman("build", "--network", "host", "--ulimit", "nofile=1024:1024",
            "--ulimit", "nproc=4096:4096", "--build-arg", f"BASE={BASE_IMAGE}",
            "-t", image, "-f", str(dockerfile), str(context), timeout=1800)
    # Build stages' images and older builds' are of no further use.
    _podman("image", "prune", "--force", check=False)
    for old in out.parent.glob(f"{stem}-*.oci.tar"):
        old.unlink()
    _podman("save", "--format", "oci-archive", "-o", str(out.with_suffix(".tmp")), image)
    out.with_suffix(".tmp").rename(out)
    return out


def product_archive() -> Path:
    """localhost/throttledjob:dev, from the project's Dockerfile."""
    inputs = [ROOT / n for n in (".dockerignore", "pyproject.toml", "README.md",
                                 "requirements-dev.txt", "requirements-run.txt")]
    inputs += sorted(p for p in (ROOT / "src").rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts)
    return _build_archive(PRODUCT_IMAGE, ROOT / "Dockerfile", ROOT, inputs)


def torch_archive() -> Path:
    """localhost/throttledjob-torch-train:dev: a user's image, PyTorch and the unmodified
    examples/torch_train.py and examples/ddp_train.py (examples/pytorch/Dockerfile), for
    the zero-code runs."""
    examples = ROOT / "examples"
    return _build_archive(TORCH_IMAGE, examples / "pytorch" / "Dockerfile", examples,
                          [examples / "pytorch" / "requirements.txt",
                           examples / "torch_train.py", examples / "ddp_train.py"])


ARCHIVES = {"pause": pause_archive, "product": product_archive, "torch": torch_archive}


def main(argv: list[str] | None = None) -> int:
    """`python3 -m tools.k8s.images [NAME...]`: build what is not cached (all by default)
    and print each archive. `make test` runs it beside the Go build: these steps wait on
    the network and the disk, the compiler on the CPU."""
    names = argv if argv is not None else sys.argv[1:]
    if os.geteuid() != 0:
        # The real node needs root; its tests skip without it (fail under CI=true).
        print("images: not root, so no real node: nothing built", file=sys.stderr)
        return 0
    for name in names or ARCHIVES:
        if name not in ARCHIVES:
            print(f"images: unknown image {name!r} (choose from {', '.join(ARCHIVES)})",
                  file=sys.stderr)
            return 2
        started = time.monotonic()
        print(f"{name}: {ARCHIVES[name]()} ({time.monotonic() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
