"""The zero-code torch hook, on real PyTorch, in fresh interpreters started as a user would."""

from __future__ import annotations

import ast
import json
import os
import py_compile
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testing.paths import ROOT
from throttledjob import __version__
from throttledjob.contracts.settings import SETTINGS_FILE, Settings
from throttledjob.runtime.autohook import enabled
from throttledjob.runtime.files import write_json_atomic
from throttledjob.runtime.inject import pythonpath_with, write_library
from throttledjob.runtime.progress_files import read_progress

TRAIN = """
import torch
from torch import nn
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    opt.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
print(torch.get_num_threads())
"""

INFER = """
import torch
from torch.utils.data import DataLoader, TensorDataset
loader = DataLoader(TensorDataset(torch.randn(32, 4)), batch_size=8, num_workers=2)
print(loader.num_workers)
with torch.no_grad():
    for (x,) in loader:
        x.sum()
"""


@pytest.fixture
def shared(tmp_path):
    directory = tmp_path / "shared"
    directory.mkdir()
    lib = write_library(str(tmp_path / "lib"))
    return directory, lib


def publish(directory, **fields) -> None:
    write_json_atomic(os.path.join(directory, SETTINGS_FILE),
                      Settings(seq=1, time=time.time(), **fields).to_dict())


def python(code: str, directory, lib: str, extra_path: str | None = None, **env):
    # Outside the repository and with the injected copy first: what a user's pod runs.
    environ = {"PATH": os.environ["PATH"], "THROTTLEDJOB_DIR": str(directory),
               "PYTHONPATH": pythonpath_with(lib, extra_path), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=environ, cwd=directory, timeout=120)


def test_enabled_needs_a_directory_and_respects_the_off_switches():
    assert not enabled({})
    assert enabled({"THROTTLEDJOB_DIR": "/x"})
    assert not enabled({"THROTTLEDJOB_DIR": "/x", "THROTTLEDJOB_AUTOHOOK": "0"})
    assert not enabled({"THROTTLEDJOB_DIR": "/x", "THROTTLEDJOB_DISABLE": "1"})


def test_each_optimizer_step_is_a_step_and_threads_are_capped(shared):
    directory, lib = shared
    publish(directory, threads=1)
    out = python(TRAIN, directory, lib)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"  # the thread cap reached torch
    [record] = read_progress(str(directory))
    assert record.steps == 5


def test_inference_loop_is_paced_per_batch_and_workers_follow_settings(shared):
    directory, lib = shared
    publish(directory, dataloader_workers=0)
    out = python(INFER, directory, lib)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"  # num_workers=2 overridden by the settings
    [record] = read_progress(str(directory))
    assert record.steps == 4


def test_no_workers_override_drops_the_options_torch_refuses_without_workers(shared):
    directory, lib = shared
    publish(directory, dataloader_workers=0)
    code = ("import torch\n"
            "from torch.utils.data import DataLoader, TensorDataset\n"
            "ds = TensorDataset(torch.ones(8, 2))\n"
            "dl = DataLoader(ds, batch_size=2, num_workers=2, persistent_workers=True,\n"
            "                prefetch_factor=4)\n"
            "print(dl.num_workers, sum(1 for _ in dl))\n")
    out = python(code, directory, lib)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["0", "4"]


def test_off_switch_leaves_the_program_alone(shared):
    directory, lib = shared
    publish(directory, threads=1)
    out = python(TRAIN, directory, lib, THROTTLEDJOB_AUTOHOOK="0")
    assert out.returncode == 0, out.stderr
    assert read_progress(str(directory)) == []
    if (os.cpu_count() or 1) > 1:
        assert out.stdout.strip() != "1"  # no thread cap either


def test_program_without_torch_pays_nothing(shared):
    directory, lib = shared
    code = ("import sys, json\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('torch', "
            "'throttledjob')))))")
    out = python(code, directory, lib)
    assert out.returncode == 0, out.stderr
    # only the tiny watcher module and the names it reads are loaded; nothing of torch or
    # the runtime's client
    assert json.loads(out.stdout) == ["throttledjob", "throttledjob.contracts",
                                      "throttledjob.contracts.names", "throttledjob.runtime",
                                      "throttledjob.runtime.autohook"]
    assert read_progress(str(directory)) == []


def test_injection_loads_no_heavy_module_at_start_up(shared):
    """Every interpreter pays for what the start-up hook imports: typing and
    importlib.abc (which loads importlib.resources, tempfile, pathlib...) cost ~15 ms."""
    directory, lib = shared
    code = "import sys, json; print(json.dumps(sorted(sys.modules)))"
    # json is imported by the code itself, after start-up, in both runs
    without = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={"PATH": os.environ["PATH"]}, check=True)
    out = python(code, directory, lib)
    assert out.returncode == 0, out.stderr
    added = set(json.loads(out.stdout)) - set(json.loads(without.stdout))
    assert not added & {"typing", "importlib.abc", "importlib.util", "pkgutil", "re", "enum",
                        "tempfile", "pathlib", "logging", "dataclasses"}


def test_the_images_own_sitecustomize_still_runs(shared, tmp_path):
    directory, lib = shared
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    marker = tmp_path / "marker"
    (theirs / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    out = python("pass", directory, lib, extra_path=str(theirs))
    assert out.returncode == 0, out.stderr
    assert marker.read_text() == "ran"


def fake_torch(root) -> str:
    """A stand-in for torch with what the hook patches: fast, and importable anywhere."""
    files = {
        "torch/__init__.py": "_n = 4\n"
                             "def get_num_threads(): return _n\n"
                             "def set_num_threads(n):\n    global _n; _n = n\n"
                             "from . import optim\n",
        "torch/optim/__init__.py": "from .optimizer import Optimizer\n",
        "torch/optim/optimizer.py": "_hooks = []\n"
                                    "def register_optimizer_step_post_hook(h): _hooks.append(h)\n"
                                    "class Optimizer:\n"
                                    "    def step(self):\n"
                                    "        for h in _hooks: h(self, (), {})\n",
        "torch/utils/__init__.py": "",
        "torch/utils/data/__init__.py": "",
        "torch/utils/data/dataloader.py": "class _BaseDataLoaderIter:\n"
                                          "    def __next__(self): raise StopIteration\n"
                                          "class DataLoader:\n"
                                          "    def __init__(self, *a, **k): self.kwargs = k\n",
    }
    for name, text in files.items():
        path = root / "faketorch" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root / "faketorch")


def test_torch_is_hooked_after_a_find_spec_probe(shared, tmp_path):
    """transformers, accelerate and lightning ask importlib.util.find_spec("torch")
    before importing it: the watcher left at that first lookup, wrapped the probe's spec
    (thrown away), and the real import went unhooked."""
    directory, lib = shared
    publish(directory, threads=1)
    code = ("import importlib.util; importlib.util.find_spec('torch')\n"
            "import torch\n"
            "for _ in range(3): torch.optim.Optimizer().step()\n"
            "print(torch.get_num_threads())\n")
    out = python(code, directory, lib, extra_path=fake_torch(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"
    [record] = read_progress(str(directory))
    assert record.steps == 3


def test_a_process_that_imports_torch_but_never_steps_is_no_peer(shared, tmp_path):
    """DataLoader workers import torch and never step: their records at 0 steps made
    them peers, and divided the trainer's share of the quota by their number."""
    directory, lib = shared
    publish(directory, cpu_quota_cores=0.6)
    out = python("import torch", directory, lib, extra_path=fake_torch(tmp_path))
    assert out.returncode == 0, out.stderr
    assert os.listdir(directory) == [SETTINGS_FILE]


def test_the_installed_throttledjob_stays_importable_under_inject(throttledjob_cmd, tmp_path):
    """The injected package shadowed the installed one in every Python the command
    started: a nested `throttledjob run` found no throttledjob.cli. Nested, it also puts
    a second injected copy on PYTHONPATH, whose sitecustomize ran the first's, forever."""
    code = "import throttledjob, throttledjob.cli; print(throttledjob.__version__)"
    out = subprocess.run([*throttledjob_cmd, "run", "--quiet", "--inject", "--",
                          *throttledjob_cmd, "run", "--quiet", "--inject", "--",
                          sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == __version__


def sitecustomize_kinds(root, kind: str) -> str:
    """The image's sitecustomize as a module, a package, or compiled alone."""
    folder = root / f"theirs-{kind}"
    folder.mkdir()
    source = "import sys; sys.stderr.write('theirs ran\\n'); X = 42\n"
    if kind == "package":
        (folder / "sitecustomize").mkdir()
        (folder / "sitecustomize" / "__init__.py").write_text(source)
    else:
        (folder / "sitecustomize.py").write_text(source)
        if kind == "pyc":
            py_compile.compile(str(folder / "sitecustomize.py"),
                               cfile=str(folder / "sitecustomize.pyc"))
            (folder / "sitecustomize.py").unlink()
    return str(folder)


@pytest.mark.parametrize("kind", ["module", "package", "pyc"])
def test_the_images_sitecustomize_runs_once_in_any_form_as_sitecustomize(shared, tmp_path,
                                                                         kind):
    """A package or a .pyc alone was skipped; the module that ran was loaded under
    another name, so `import sitecustomize; sitecustomize.X` failed."""
    directory, lib = shared
    out = python("import sitecustomize; print(sitecustomize.X)", directory, lib,
                 extra_path=sitecustomize_kinds(tmp_path, kind))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "42" and out.stderr.count("theirs ran") == 1


@pytest.mark.parametrize("layout", ["two copies", "a symlink"])
def test_two_injected_copies_start_and_chain_once(shared, tmp_path, layout):
    """Each copy ran the other's sitecustomize until RecursionError, in every Python."""
    directory, lib = shared
    if layout == "two copies":
        other = write_library(str(tmp_path / "lib2"))
    else:
        other = str(tmp_path / "link")
        os.symlink(lib, other)
    theirs = sitecustomize_kinds(tmp_path, "module")
    code = ("import sys, torch; torch.optim.Optimizer().step(); "
            "print(sys.modules['sitecustomize'].X)")
    out = python(code, directory, lib,
                 extra_path=os.pathsep.join([other, theirs, fake_torch(tmp_path)]))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "42" and out.stderr.count("theirs ran") == 1
    [record] = read_progress(str(directory))  # hooked once: one step, not two
    assert record.steps == 1


def test_an_old_python_starts_silently(shared):
    """Every Python in the image reads the injected sitecustomize.py: it parses under the
    oldest grammar the ast module knows (no f-strings, no annotations: Python 2 reads it
    too), and under 3.7 it does nothing (run with -S, so that the interpreter's version
    is made 3.6 before the file is imported)."""
    directory, lib = shared
    ast.parse(Path(lib, "sitecustomize.py").read_text(), feature_version=(3, 4))
    code = ("import sys; sys.version_info = (3, 6, 9); import sitecustomize; "
            "print(getattr(sys, '_throttledjob_started', False), "
            "any(type(f).__name__ == '_TorchWatcher' for f in sys.meta_path))")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"], "PYTHONPATH": lib,
                              "THROTTLEDJOB_DIR": str(directory)}, timeout=60)
    assert (out.returncode, out.stdout, out.stderr) == (0, "False False\n", "")


def test_local_inject_keeps_the_users_pythonpath(throttledjob_cmd, tmp_path):
    code = "import os; print(os.environ['PYTHONPATH'])"
    out = subprocess.run([*throttledjob_cmd, "run", "--quiet", "--inject", "--", sys.executable,
                          "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": "/users/own"})
    first, *rest = out.stdout.strip().split(os.pathsep)
    assert first.endswith("lib") and rest == ["/users/own"]


def test_unmodified_torch_training_is_held_to_the_target(throttledjob_cmd, tmp_path):
    report = tmp_path / "report.json"
    out = subprocess.run([*throttledjob_cmd, "run", "--quiet", "--inject", "--cpu-peak", "1",
                          "--enforcement", "both",
                          "--max-slowdown", "4", "--report", str(report), "--",
                          sys.executable, str(ROOT / "examples" / "torch_train.py"),
                          "--steps", "400"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    r = json.loads(report.read_text())
    assert r["steps"] == 400  # every optimizer step was recorded for the controller
    assert "pacing" in r["controller"]["levers_used"]
    assert r["cpu_peak_cores"] <= 1.1
