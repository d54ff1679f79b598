"""`make image`: the product image for a cluster of your own (kind, minikube, k3d), as an
archive its nodes load, so that nothing needs a registry.

    make image                 # docker, else podman: the Dockerfile on python:3.11-slim
    make image LOCAL_BASE=1    # no registry at all (root, Debian): the base built here

It writes build/throttledjob-image.tar (localhost/throttledjob:dev) and prints how each
cluster loads it; examples/one-machine/values.yaml then installs the chart with that image
and never pulls. The suite loads the archive into the real node's containerd as `kind
load image-archive` does (tests/cluster/test_examples_live.py). Stdlib only.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "localhost/throttledjob:dev"
ARCHIVE = ROOT / "build" / "throttledjob-image.tar"
ENGINES = ("docker", "podman")
LOAD = (f"  kind:     kind load image-archive {ARCHIVE.relative_to(ROOT)}\n"
        f"  minikube: minikube image load {ARCHIVE.relative_to(ROOT)}\n"
        f"  k3d:      k3d image import {ARCHIVE.relative_to(ROOT)}\n"
        "then: helm install throttledjob charts/throttledjob -n throttledjob-system "
        "--create-namespace -f examples/one-machine/values.yaml")


class ImageError(RuntimeError):
    """Why no image was made, in one line."""


def engine() -> str:
    """The first container engine on PATH."""
    for name in ENGINES:
        if shutil.which(name):
            return name
    raise ImageError("make image needs docker or podman on PATH (or, as root on Debian "
                     "with no registry at all: make image LOCAL_BASE=1)")


def build_with(tool: str) -> Path:
    """The Dockerfile built by `tool`, saved as a docker-archive (what kind, minikube and
    k3d all load); the archive is replaced only once complete."""
    for args in (["build", "-t", IMAGE, str(ROOT)],
                 ["save", "-o", str(ARCHIVE.with_suffix(".tmp")), IMAGE]
                 + (["--format", "docker-archive"] if tool == "podman" else [])):
        ARCHIVE.parent.mkdir(exist_ok=True)
        if subprocess.run([tool, *args]).returncode != 0:
            ARCHIVE.with_suffix(".tmp").unlink(missing_ok=True)
            raise ImageError(f"make image: {tool} {args[0]} failed (its output is above)")
    ARCHIVE.with_suffix(".tmp").rename(ARCHIVE)
    return ARCHIVE


def build_on_local_base() -> Path:
    """The same Dockerfile on a Debian base built here (tools/k8s/images.py: root,
    debootstrap, podman), for a machine that reaches no registry."""
    from tools.k8s.images import product_archive

    ARCHIVE.parent.mkdir(exist_ok=True)
    shutil.copyfile(product_archive(), ARCHIVE.with_suffix(".tmp"))
    ARCHIVE.with_suffix(".tmp").rename(ARCHIVE)
    return ARCHIVE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make image", description=__doc__.splitlines()[0])
    parser.add_argument("--local-base", action="store_true",
                        help="build on a Debian base made here (no registry needed; root)")
    args = parser.parse_args(argv)
    try:
        archive = build_on_local_base() if args.local_base else build_with(engine())
    except (ImageError, RuntimeError) as e:
        print(str(e).splitlines()[0], file=sys.stderr)
        return 1
    print(f"{IMAGE} -> {archive.relative_to(ROOT)}; load it into your cluster's nodes:\n{LOAD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
