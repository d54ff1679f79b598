"""The workload side: step(), pacing, progress, levers, parameters, OOM guard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from throttledjob.contracts.settings import SETTINGS_FILE, Settings
from throttledjob.runtime import Throttle
from throttledjob.runtime.batching import BatchPlan, scaled_batch
from throttledjob.runtime.files import write_json_atomic
from throttledjob.runtime.progress_files import read_progress


def publish(directory, **fields) -> None:
    s = Settings(seq=1, time=time.time(), **fields)
    write_json_atomic(os.path.join(directory, SETTINGS_FILE), s.to_dict())


def busy(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_without_directory_everything_is_a_no_op(tmp_path, monkeypatch):
    monkeypatch.delenv("THROTTLEDJOB_DIR", raising=False)
    t = Throttle()
    for _ in range(1000):
        t.step()
    assert not t.enabled and t.steps == 1000
    assert t.batch_size(32) == 32
    assert t.param("lr", 0.1) == 0.1


def test_disable_variable_turns_it_off(tmp_path, monkeypatch):
    monkeypatch.setenv("THROTTLEDJOB_DISABLE", "1")
    publish(str(tmp_path), cpu_quota_cores=0.1)
    t = Throttle(str(tmp_path))
    t.step()
    assert not t.enabled and os.listdir(tmp_path) == [SETTINGS_FILE]


def test_step_records_progress(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,GPU-abc")
    publish(str(tmp_path))
    t = Throttle(str(tmp_path))
    for _ in range(5):
        t.step()
    t.flush()
    [record] = read_progress(str(tmp_path))
    assert record.pid == os.getpid() and record.steps == 5
    # The CPU clock the sidecar reads steps over (measure.steps_in_interval).
    assert 0 < record.cpu_seconds <= time.process_time()
    assert record.visible_devices == ["0", "GPU-abc"]


def test_pacing_holds_this_process_to_its_quota(tmp_path):
    publish(str(tmp_path), cpu_quota_cores=0.5, max_pause_fraction=0.9)
    t = Throttle(str(tmp_path))
    t.step()
    cpu0, wall0 = time.process_time(), time.monotonic()
    while time.monotonic() - wall0 < 2.0:
        busy(0.01)
        t.step()
    usage = (time.process_time() - cpu0) / (time.monotonic() - wall0)
    assert 0.4 < usage < 0.6
    assert t._budget.paused_seconds > 0.5


def test_quota_is_shared_by_live_cooperating_processes(tmp_path):
    publish(str(tmp_path), cpu_quota_cores=1.0, max_pause_fraction=0.9)
    peer = tmp_path / "progress-999999.json"  # another process of the same job
    peer.write_text(json.dumps({"schema": 1, "pid": 999999, "steps": 1}))
    t = Throttle(str(tmp_path))
    t.step()
    assert t._budget.rate_cores == pytest.approx(0.5)


def test_rate_limit_spaces_steps(tmp_path):
    publish(str(tmp_path), rate_limit_per_second=50.0, max_pause_fraction=0.9)
    t = Throttle(str(tmp_path))
    start = time.monotonic()
    for _ in range(26):
        t.step()
    assert time.monotonic() - start >= 0.45


def test_stale_settings_fail_open(tmp_path):
    publish(str(tmp_path), cpu_quota_cores=0.1, stale_after_seconds=1.0)
    old = time.time() - 60
    os.utime(tmp_path / SETTINGS_FILE, (old, old))
    t = Throttle(str(tmp_path))
    t.step()
    assert t.settings.cpu_quota_cores is None


def test_unwritable_progress_never_raises_into_user_code(tmp_path, caplog):
    publish(str(tmp_path), cpu_quota_cores=2.0)
    # A directory where the progress file goes: every write fails, as on a full or
    # read-only volume (chmod would not stop root, and CI runs as root).
    os.mkdir(tmp_path / f"progress-{os.getpid()}.json")
    t = Throttle(str(tmp_path))
    for _ in range(3):
        t.step()
        t.flush()
    assert t.settings.cpu_quota_cores == 2.0
    assert len([r for r in caplog.records if "cannot write progress" in r.message]) == 1


def test_batch_scale_and_plan_keep_the_effective_batch(tmp_path):
    publish(str(tmp_path), batch_scale=0.25)
    t = Throttle(str(tmp_path))
    t.step()
    assert t.batch_size(64) == 16
    plan = t.batch_plan(50)
    slices = list(plan.slices())
    assert plan.micro == 12 and plan.steps == 5
    assert sum(s.stop - s.start for s in slices) == 50
    assert sum(plan.weight(s) for s in slices) == pytest.approx(1.0)


def test_scaled_batch_is_at_least_one():
    assert scaled_batch(3, 0.01) == 1
    with pytest.raises(ValueError):
        scaled_batch(0, 1.0)
    assert BatchPlan(10, 10).steps == 1


def test_parameters_are_typed_bounded_and_live(tmp_path, caplog):
    publish(str(tmp_path), params={"workers": 6, "mode": "fast", "lr": 1})
    t = Throttle(str(tmp_path))
    t.step()
    assert t.param("workers", 4, low=1, high=8) == 6
    assert t.param("mode", "safe", choices=["safe", "fast"]) == "fast"
    assert t.param("lr", 0.1, low=0.0, high=1.0) == 1.0  # an int is a valid float
    publish(str(tmp_path), params={"workers": 99})
    os.utime(tmp_path / SETTINGS_FILE, (time.time() + 1, time.time() + 1))
    t._next_tick = 0
    t._watcher._next_check = 0
    t.step()
    assert t.param("workers", 4, low=1, high=8) == 4  # out of bounds: the default
    assert any("above 8" in r.message for r in caplog.records)


def test_bad_parameter_declaration_is_refused():
    t = Throttle("")
    with pytest.raises(ValueError, match="low"):
        t.param("x", 5, low=10, high=1)
    with pytest.raises(ValueError, match="default"):
        t.param("y", 50, low=0, high=10)


class OutOfMemoryError(RuntimeError):
    """Named like torch.cuda.OutOfMemoryError, which the guard recognises by name."""


def test_oom_guard_halves_the_micro_batch_and_retries(tmp_path):
    publish(str(tmp_path))
    t = Throttle(str(tmp_path))
    t.step()
    sizes = []

    def train(micro: int) -> str:
        sizes.append(micro)
        if micro > 16:
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return "ok"

    assert t.retry_on_oom(train, 64, backoff_seconds=0.0) == "ok"
    assert sizes == [64, 32, 16]
    assert t.oom_events == 2 and t.batch_size(64) == 16  # the smaller size sticks


def test_oom_guard_does_not_swallow_other_errors(tmp_path):
    t = Throttle(str(tmp_path))
    with pytest.raises(KeyError):
        t.retry_on_oom(lambda micro: {}["x"], 8)


def test_oom_guard_gives_up_after_retries(tmp_path):
    t = Throttle(str(tmp_path))

    def always(micro):
        raise OutOfMemoryError("out of memory")

    with pytest.raises(OutOfMemoryError):
        t.retry_on_oom(always, 64, retries=2, backoff_seconds=0.0)
    assert t.oom_events == 2


def test_thread_cap_applies_to_real_torch_and_restores_every_pool(tmp_path):
    """Capped and lifted twice, through settings.json: torch and its OpenMP/BLAS pools
    end where they began (threadpoolctl once recorded the already-capped count as the
    original, leaving torch at one thread after the cap was lifted)."""
    import subprocess

    code = f"""
import json, os, time, torch
from threadpoolctl import threadpool_info
from throttledjob.runtime import Throttle
from throttledjob.runtime.files import write_json_atomic
from throttledjob.contracts.settings import SETTINGS_FILE, Settings
torch.set_num_threads(2)
def state():
    return [torch.get_num_threads(), sorted(i["num_threads"] for i in threadpool_info())]
def publish(seq, threads):
    s = Settings(seq=seq, time=time.time(), threads=threads)
    write_json_atomic(os.path.join({str(tmp_path)!r}, SETTINGS_FILE), s.to_dict())
    t._watcher._next_check = t._next_tick = 0
seen = [state()]
t = Throttle({str(tmp_path)!r})
for seq, threads in enumerate([1, None, 1, None], 1):
    publish(seq, threads)
    t.step()
    seen.append(state())
print(json.dumps(seen))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    before, capped, lifted, capped2, lifted2 = json.loads(out)
    assert before[0] == 2 and 2 in before[1]
    assert capped == capped2 == [1, [1] * len(before[1])]
    assert lifted == lifted2 == before


def test_a_lifted_cap_gives_back_the_count_the_script_set_after_importing_torch(tmp_path):
    """The levers are applied when torch is imported (the autohook's refresh); the
    script then sets its own count (a DDP rank: 1, where torch's default is 3 here). A
    cap and its lift leave the script's 1, not torch's default; a cap never raises the
    count; a count the script sets under a cap stands when the cap lifts."""
    import subprocess

    code = f"""
import json, os, time, torch
from throttledjob.runtime import Throttle
from throttledjob.runtime.files import write_json_atomic
from throttledjob.contracts.settings import SETTINGS_FILE, Settings
torch.set_num_threads(3)  # torch's default on a 3-core machine
t = Throttle({str(tmp_path)!r})
t.refresh_levers()        # what the autohook does when torch is imported
torch.set_num_threads(1)  # the script's own choice
seen = []
def publish(seq, threads):
    s = Settings(seq=seq, time=time.time(), threads=threads)
    write_json_atomic(os.path.join({str(tmp_path)!r}, SETTINGS_FILE), s.to_dict())
    t._watcher._next_check = t._next_tick = 0
    t.step()
    seen.append(torch.get_num_threads())
publish(1, 2)             # a cap over the script's count does not raise it
publish(2, None)
torch.set_num_threads(2)  # the script's own choice changes
publish(3, 1)
torch.set_num_threads(3)  # and again, under our cap: a lift leaves it
publish(4, None)
print(json.dumps(seen))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == [1, 1, 1, 3]


def test_runtime_does_not_import_heavy_libraries(tmp_path):
    import subprocess

    code = ("import sys; from throttledjob import runtime as tj; tj.step(); tj.batch_size(8);"
            "print(sorted(m for m in ('torch','numpy','threadpoolctl','psutil','yaml')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "THROTTLEDJOB_DIR": str(tmp_path)}, check=True)
    assert out.stdout.strip() == "[]"


def test_a_process_that_never_steps_writes_no_progress(tmp_path):
    """Only processes that report steps share the quota: with a record at 0 steps from
    every process that imported torch (what the hook's refresh did), two DataLoader
    workers cut the trainer's share of the quota to a third."""
    publish(str(tmp_path), cpu_quota_cores=0.6, max_pause_fraction=0.9)
    idle = Throttle(str(tmp_path))
    idle.refresh_levers()
    idle.flush()
    assert read_progress(str(tmp_path)) == []
    trainer = Throttle(str(tmp_path))
    trainer.step()
    assert trainer._budget.rate_cores == pytest.approx(0.6)  # not 0.3
    assert [r.steps for r in read_progress(str(tmp_path))] == [1]


def run_python(code: str, directory, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "THROTTLEDJOB_DIR": str(directory)},
                          timeout=timeout)


def test_a_forked_child_counts_only_its_own_steps(tmp_path):
    """A forked child inherited the default Throttle: at its exit it wrote the parent's
    300 steps under its own pid (300 + 3 children x 10 were reported as 1230)."""
    publish(str(tmp_path))
    code = """
import os, sys
from throttledjob import runtime as tj
for _ in range(300):
    tj.step()
children = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        for _ in range(10):
            tj.step()
        sys.exit(0)  # atexit flushes the child's record
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
print(os.getpid())
"""
    out = run_python(code, tmp_path)
    assert out.returncode == 0, out.stderr
    steps = {r.pid: r.steps for r in read_progress(str(tmp_path))}
    parent = int(out.stdout)
    assert steps.pop(parent) == 300
    assert sorted(steps.values()) == [10, 10, 10]


def test_a_fork_while_other_threads_start_stepping_never_hangs_the_child(tmp_path):
    """Threads call step() as soon as the runtime is imported while the main thread
    forks: a child forked during the threads' lazy import of the client hung forever."""
    publish(str(tmp_path))
    code = """
import faulthandler, os, threading
from throttledjob import runtime as tj
def work():
    while True:
        tj.step()
for _ in range(2):
    threading.Thread(target=work, daemon=True).start()
for _ in range(20):
    pid = os.fork()
    if pid == 0:
        faulthandler.dump_traceback_later(5, exit=True)  # a hang exits 1
        tj.step()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert status == 0, status
print("ok")
"""
    out = run_python(code, tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_default_is_made_once_when_threads_race_for_it(monkeypatch):
    import threading

    import throttledjob.runtime as runtime
    from throttledjob.runtime import client

    monkeypatch.delenv("THROTTLEDJOB_DIR", raising=False)
    monkeypatch.setattr(runtime, "_default", None)
    slow_init = client.Throttle.__init__

    def __init__(self, *args, **kwargs):
        time.sleep(0.05)  # wide open the window between the check and the assignment
        slow_init(self, *args, **kwargs)

    monkeypatch.setattr(client.Throttle, "__init__", __init__)
    made = []
    threads = [threading.Thread(target=lambda: made.append(runtime.default()))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 4 and len({id(t) for t in made}) == 1
