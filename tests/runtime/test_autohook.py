"""The zero-code torch hook, on real PyTorch, in fresh interpreters started as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from testing.paths import ROOT
from throttledjob.contracts.settings import SETTINGS_FILE, Settings
from throttledjob.runtime.autohook import enabled
from throttledjob.runtime.files import write_json_atomic
from throttledjob.runtime.inject import pythonpath_with, write_library
from throttledjob.runtime.progress import read_progress

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


def test_the_images_own_sitecustomize_still_runs(shared, tmp_path):
    directory, lib = shared
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    marker = tmp_path / "marker"
    (theirs / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    out = python("pass", directory, lib, extra_path=str(theirs))
    assert out.returncode == 0, out.stderr
    assert marker.read_text() == "ran"


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
