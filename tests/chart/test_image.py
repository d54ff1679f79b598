"""The Dockerfile: hadolint clean, and its build steps run for real in a fresh venv.

No image can be built here (no daemon, docs/dev/testing.md), so the test interprets the build
stage itself: COPY from the context as .dockerignore filters it, WORKDIR, ENV, RUN with
the image's paths mapped into a temporary directory. Any other instruction in the build
stage fails the test, so the two cannot silently part ways.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testing.helpers import require_tool
from testing.paths import ROOT

DOCKERFILE = ROOT / "Dockerfile"
VENV = "/opt/throttledjob"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out, buf = [], ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        buf += line.rstrip("\\").strip() + " " if line.endswith("\\") else line.strip()
        if not line.endswith("\\"):
            name, _, args = buf.partition(" ")
            out.append((name.upper(), args.strip()))
            buf = ""
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for ins in instructions(DOCKERFILE.read_text()):
        if ins[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


def global_args() -> dict[str, str]:
    """Defaults of the ARGs declared before the first FROM (the ones FROM may use)."""
    out = {}
    for kind, args in instructions(DOCKERFILE.read_text()):
        if kind == "FROM":
            break
        if kind == "ARG":
            name, _, default = args.partition("=")
            out[name] = default
    return out


def expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], text)


# The product's, and the example user image the real node's PyTorch run uses.
@pytest.mark.parametrize("dockerfile", [DOCKERFILE, ROOT / "examples/pytorch/Dockerfile"],
                         ids=["product", "examples-pytorch"])
def test_hadolint_clean(dockerfile: Path) -> None:
    hadolint = require_tool("hadolint")
    proc = subprocess.run([hadolint, "--failure-threshold", "info", str(dockerfile)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_shape_multi_stage_pinned_non_root_one_entrypoint() -> None:
    build, final = stages()
    # The base is a build argument (a local image where no registry is reachable,
    # tools/k8s/images.py), whose default is the pinned official image.
    base = build[0][1].split()[0]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", expand(base, global_args())), base
    # The venv's interpreter path must exist in the final image: the same base.
    assert final[0] == ("FROM", base)
    final_kinds = [k for k, _ in final]
    assert "RUN" not in final_kinds, "build tools or packages installed in the final stage"
    assert ("COPY", f"--from=build {VENV} {VENV}") in final
    (user,) = [a for k, a in final if k == "USER"]
    assert re.fullmatch(r"[1-9]\d*:[1-9]\d*", user), user  # numeric, not root
    (entry,) = [a for k, a in final if k == "ENTRYPOINT"]
    assert json.loads(entry) == ["throttledjob"]
    labels = " ".join(a for k, a in final if k == "LABEL")
    for key in ("title", "version", "source", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels


def requirements_text(path: Path) -> str:
    """A requirements file with its `-r` includes inlined."""
    out = []
    for line in path.read_text().splitlines():
        m = re.match(r"^-r\s+(\S+)", line)
        out.append(requirements_text(path.parent / m.group(1)) if m else line)
    return "\n".join(out)


def norm(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _ignored(rel: str, patterns: list[str]) -> bool:
    """.dockerignore semantics for the patterns used here (last match wins, ! re-includes)."""
    ignored = False
    for p in patterns:
        negate = p.startswith("!")
        p = p.removeprefix("!").rstrip("/")
        parts = rel.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        pat = p.replace("**/", "*")
        if any(fnmatch.fnmatch(x, pat) or fnmatch.fnmatch(x.split("/")[-1], pat.lstrip("*"))
               if p.startswith("**/") else fnmatch.fnmatch(x, pat) for x in prefixes):
            ignored = not negate
    return ignored


def build_context(dest: Path) -> Path:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for top, dirs, names in os.walk(ROOT):
        # Not into .git or any venv (.venv, .venv-*): large, and other tools may be
        # rewriting them meanwhile (a directory vanishing mid-walk).
        dirs[:] = [d for d in dirs if not (top == str(ROOT) and d.startswith((".git", ".venv")))]
        for name in names:
            path = Path(top) / name
            rel = path.relative_to(ROOT).as_posix()
            if not _ignored(rel, patterns):
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, dest / rel)
    return dest


def test_dockerignore_keeps_the_context_small(tmp_path) -> None:
    ctx = build_context(tmp_path / "ctx")
    files = {p.relative_to(ctx).as_posix() for p in ctx.rglob("*") if p.is_file()}
    assert "pyproject.toml" in files and "src/throttledjob/operator/main.py" in files
    assert not any(f.startswith(("tests/", "bench/", "charts/", "docs/", ".venv/"))
                   or "__pycache__" in f for f in files)


def test_build_stage_steps_install_a_working_package(tmp_path) -> None:
    """The build stage's exact steps, then the final image's entry point, in a temp root."""
    require_tool("pip")  # PyPI is reachable through pip only (docs/dev/testing.md)
    ctx = build_context(tmp_path / "ctx")
    root = tmp_path / "image"
    mapping = {VENV: str(root / VENV.lstrip("/")), "/src": str(root / "src")}

    def mapped(s: str) -> str:
        for src, dst in mapping.items():
            s = re.sub(rf"(?<![\w/]){re.escape(src)}(?=/|\s|$|\")", dst, s)
        return s

    # `python` is the base image's interpreter: this machine's, outside our venv.
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "python").symlink_to(getattr(sys, "_base_executable", sys.executable))
    env = {"PATH": f"{shim}:/usr/bin:/bin", "HOME": str(tmp_path)}
    cwd = root
    build, final = stages()
    for kind, args in build[1:]:
        if kind == "ENV":
            env.update(dict(kv.split("=", 1) for kv in shlex.split(args)))
        elif kind == "WORKDIR":
            cwd = Path(mapped(args))
            cwd.mkdir(parents=True, exist_ok=True)
        elif kind == "COPY":
            *sources, dest = shlex.split(args)
            for s in sources:
                src = ctx / s
                target = cwd / dest if not dest.startswith("/") else Path(mapped(dest))
                if src.is_dir():
                    shutil.copytree(src, target, dirs_exist_ok=True)
                else:
                    target.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, target / src.name)
        elif kind == "RUN":
            proc = subprocess.run(["/bin/sh", "-c", mapped(args)], cwd=cwd, env=env,
                                  capture_output=True, text=True, timeout=900)
            assert proc.returncode == 0, f"RUN {args}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        else:
            pytest.fail(f"the test does not know how to run {kind} of the build stage")

    venv_bin = Path(mapping[VENV]) / "bin"
    # Installed, not linked to the build context: the final stage copies only the venv.
    shutil.rmtree(root / "src")
    final_env = {**{k: v for k, v in env.items() if k != "PATH"}, "HOME": str(tmp_path),
                 "PATH": f"{venv_bin}:/usr/bin:/bin"}
    for k, a in final:
        if k == "ENV":
            final_env.update({key: mapped(val) for key, val in (
                kv.split("=", 1) for kv in shlex.split(a)) if key != "PATH"})
    entry = json.loads(next(a for k, a in final if k == "ENTRYPOINT"))
    for sub in (["--help"], ["operator", "--help"], ["sidecar", "--help"], ["run", "--help"]):
        proc = subprocess.run([str(venv_bin / entry[0]), *sub], env=final_env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{sub}: {proc.stderr}"
    # The operator's and the sidecar's dependencies import, at the pinned versions.
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", requirements_text(
        ROOT / "requirements-dev.txt"), re.M))
    freeze = subprocess.run([str(venv_bin / "python"), "-m", "pip", "freeze"], env=final_env,
                            capture_output=True, text=True, timeout=60).stdout
    installed = {norm(k): v for k, v in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", freeze, re.M)}
    pins = {norm(k): v for k, v in pins.items()}
    for name in ("kopf", "urllib3", "psutil", "prometheus-client", "pyyaml",
                 "nvidia-ml-py"):
        assert installed.get(name) == pins[name], (name, sorted(installed))
    # Nor the official client: the operator logs in itself (operator/login.py).
    assert not {"pytest", "torch", "ruff", "kubernetes"} & set(installed)
    code = ("import kopf, urllib3, psutil, pynvml, prometheus_client, yaml; "
            "import throttledjob.operator.handlers, throttledjob.sidecar.agent; "
            "import throttledjob, os; print(throttledjob.__file__)")
    proc = subprocess.run([str(venv_bin / "python"), "-c", code], env=final_env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith(mapping[VENV]), proc.stdout
    assert os.access(venv_bin / "throttledjob", os.X_OK)
