"""The distribution: the runtime installs and imports with no third-party package."""

from __future__ import annotations

import os
import subprocess
import sys
import venv

import pytest
import setuptools

from testing.paths import ROOT


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory):
    """A fresh venv with only `pip install --no-deps throttledjob`, from a wheel built here."""
    where = tmp_path_factory.mktemp("bare")
    wheels = where / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "-w", str(wheels), str(ROOT)], check=True)
    env_dir = where / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    [wheel] = wheels.glob("throttledjob-*.whl")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    str(wheel)], check=True)
    return env_dir


def test_runtime_imports_and_works_without_dependencies(bare_venv, tmp_path):
    code = ("import sys\n"
            "from throttledjob import runtime as tj\n"
            "tj.step(); assert tj.batch_size(8) == 8\n"
            "third = [m for m in ('psutil', 'yaml', 'prometheus_client', 'kopf', 'pynvml')\n"
            "         if m in sys.modules]\n"
            "assert not third, third\n"
            "print('ok')\n")
    out = subprocess.run([str(bare_venv / "bin" / "python"), "-c", code], cwd=tmp_path,
                         capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr
    freeze = subprocess.run([str(bare_venv / "bin" / "python"), "-m", "pip", "list",
                             "--format=freeze"], capture_output=True, text=True).stdout
    assert "psutil" not in freeze and "PyYAML" not in freeze


def test_run_without_the_sidecar_extra_says_what_to_install(bare_venv):
    out = subprocess.run([str(bare_venv / "bin" / "throttledjob"), "run", "--cpu-peak", "1",
                          "--", "true"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "pip install 'throttledjob[sidecar]'" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_no_import_name_shadows_the_standard_library():
    # From the repository root, with the root first on sys.path (as `python -c` has it),
    # `operator` must still be the standard library's and `throttledjob` the installed one.
    code = ("import sys; sys.path.insert(0, '.'); sys.modules.pop('operator', None)\n"
            "import importlib; op = importlib.import_module('operator')\n"
            "import throttledjob.runtime\n"
            "print(op.__file__); print(throttledjob.runtime.__file__)")
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=ROOT, capture_output=True,
                         text=True, env={"PYTHONPATH": ":".join(p for p in sys.path if p)})
    op_file, runtime_file = out.stdout.split()
    assert not op_file.startswith(str(ROOT)), op_file
    assert runtime_file.startswith(str(ROOT / "src" / "throttledjob")), runtime_file


def test_the_usual_editable_install_imports_every_component(tmp_path):
    # `pip install -e .` in its default mode, in a fresh venv, imported from outside the
    # repository: each component resolves to its folder under src/throttledjob.
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    # The build backend and the extras' dependencies come from the test environment, offline
    # (a PYTHONPATH entry runs no .pth file, so not the test environment's own install).
    deps = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(setuptools.__file__))}
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "-e", str(ROOT)], check=True, cwd=tmp_path,
                   env=deps)
    code = ("import throttledjob.sidecar, throttledjob.operator.handlers, throttledjob.runtime\n"
            "for m in (throttledjob.sidecar, throttledjob.operator.handlers,"
            " throttledjob.runtime): print(m.__file__)")
    out = subprocess.run([python, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env=deps)
    assert out.returncode == 0, out.stderr
    src = ROOT / "src" / "throttledjob"
    assert out.stdout.split() == [str(src / "sidecar" / "__init__.py"),
                                  str(src / "operator" / "handlers.py"),
                                  str(src / "runtime" / "__init__.py")]
