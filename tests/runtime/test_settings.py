"""The settings file contract: validation, atomic writes, and the watcher's fault handling."""

from __future__ import annotations

import json
import os

import pytest

from throttledjob.contracts.settings import (
    SETTINGS_FILE,
    UNTHROTTLED,
    Settings,
    SettingsError,
    parse_settings,
)
from throttledjob.runtime.files import read_json_bounded, write_json_atomic
from throttledjob.runtime.settings_watch import SettingsWatcher


def good(**fields) -> dict:
    return {**Settings(seq=1, time=100.0, cpu_quota_cores=1.5).to_dict(), **fields}


def test_round_trip_keeps_every_field():
    s = Settings(seq=7, time=12.5, cpu_quota_cores=1.25, max_pause_fraction=0.2,
                 probing=True, threads=3,
                 batch_scale=0.5, rate_limit_per_second=10.0, gpu_memory_fraction=0.8,
                 dataloader_workers=2, params={"lr": 0.1, "mode": "fast"},
                 stale_after_seconds=5.0)
    assert parse_settings(json.loads(json.dumps(s.to_dict()))) == s


@pytest.mark.parametrize("field, value", [
    ("schema", 2), ("schema", None), ("seq", -1), ("seq", 1.5), ("cpu_quota_cores", 0),
    ("cpu_quota_cores", "1"), ("cpu_quota_cores", True), ("max_pause_fraction", 1.0),
    ("threads", 0), ("threads", 2.5), ("batch_scale", 0.0), ("batch_scale", 1.5),
    ("gpu_memory_fraction", 2.0), ("stale_after_seconds", 0), ("params", []),
    ("params", {"x": [1]}), ("params", {"x": float("inf")}), ("probing", 1),
    # JSON reads 1e400 as inf: int() of it raised OverflowError, past the watcher
    ("threads", float("inf")), ("seq", float("inf")), ("dataloader_workers", float("nan")),
])
def test_invalid_field_is_refused_by_name(field, value):
    with pytest.raises(SettingsError, match=field):
        parse_settings(good(**{field: value}))


def test_non_object_is_refused():
    with pytest.raises(SettingsError):
        parse_settings([1, 2])


def test_atomic_write_leaves_no_temp_file(tmp_path):
    path = tmp_path / "x.json"
    write_json_atomic(str(path), {"a": 1})
    write_json_atomic(str(path), {"a": 2})
    assert read_json_bounded(str(path)) == {"a": 2}
    assert os.listdir(tmp_path) == ["x.json"]


def test_atomic_write_refuses_nan_and_keeps_old_file(tmp_path):
    path = tmp_path / "x.json"
    write_json_atomic(str(path), {"a": 1})
    with pytest.raises(ValueError):
        write_json_atomic(str(path), {"a": float("nan")})
    assert read_json_bounded(str(path)) == {"a": 1}
    assert os.listdir(tmp_path) == ["x.json"]


def test_bounded_read_refuses_huge_file(tmp_path):
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"x": "a" * 100_000}))
    with pytest.raises(ValueError, match="larger than"):
        read_json_bounded(str(path))


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def watcher(tmp_path, on_stale="open", now=1000.0):
    clock = Clock(now)
    mono = Clock(0.0)
    w = SettingsWatcher(str(tmp_path), check_interval=0.25, on_stale=on_stale,
                        clock=clock, monotonic=mono)
    return w, clock, mono


def write(tmp_path, obj, mtime=1000.0) -> None:
    path = tmp_path / SETTINGS_FILE
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    os.utime(path, (mtime, mtime))


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_bounded_read_neither_blocks_on_a_fifo_nor_follows_a_symlink(tmp_path, kind):
    """The shared directory is the workload's too: a FIFO named like our file blocked the
    sidecar's loop forever in open(); a symlink could point at a file that is not ours."""
    import threading

    target = tmp_path / "progress-1.json"
    if kind == "fifo":
        os.mkfifo(target)
    else:
        real = tmp_path / "elsewhere.json"
        real.write_text(json.dumps({"schema": 1, "pid": 1}))
        target.symlink_to(real)
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            read_json_bounded(str(target))
        except (OSError, ValueError) as e:
            outcome.append(e)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    assert not reader.is_alive(), "read_json_bounded blocked"
    assert len(outcome) == 1  # refused, not read


def test_progress_reading_skips_what_is_not_a_regular_file_and_is_bounded(tmp_path):
    from throttledjob.contracts.progress import MAX_PROGRESS_FILES, Progress
    from throttledjob.runtime.progress_files import count_fresh_peers, read_progress, write_progress

    write_progress(str(tmp_path), Progress(pid=42, steps=3, time=1.0))
    os.mkfifo(tmp_path / "progress-43.json")
    (tmp_path / "progress-44.json").symlink_to(tmp_path / "progress-42.json")
    assert [r.pid for r in read_progress(str(tmp_path))] == [42]
    assert count_fresh_peers(str(tmp_path), now=os.path.getmtime(tmp_path / "progress-42.json"),
                             max_age=2.0) == 1
    for pid in range(1000, 1000 + MAX_PROGRESS_FILES + 50):
        write_progress(str(tmp_path), Progress(pid=pid, steps=1, time=1.0))
    assert len(read_progress(str(tmp_path))) == MAX_PROGRESS_FILES


def test_missing_file_means_unthrottled(tmp_path):
    w, _, _ = watcher(tmp_path)
    assert w.current() is UNTHROTTLED
    assert w.stale


def test_reads_settings_and_rechecks_only_after_interval(tmp_path):
    w, _, mono = watcher(tmp_path)
    write(tmp_path, good(seq=1))
    assert w.current().seq == 1
    write(tmp_path, good(seq=2, threads=4), mtime=1000.5)
    assert w.current().seq == 1  # within check_interval: no stat at all
    mono.t += 0.3
    assert w.current().seq == 2


@pytest.mark.parametrize("bad", ['{"schema": 1, "seq": ', "not json", '{"schema": 99}',
                                 '{"schema": 1, "cpu_quota_cores": -1}', "[]",
                                 # OverflowError and RecursionError reached the workload
                                 '{"schema": 1, "threads": 1e400}', '{"schema": 1, "seq": 1e400}',
                                 '{"schema": 1, "params": ' + "[" * 30_000 + "]" * 30_000 + "}"])
def test_bad_file_keeps_last_good_settings_and_logs_once(tmp_path, caplog, bad):
    w, _, mono = watcher(tmp_path)
    write(tmp_path, good(seq=5))
    assert w.current().seq == 5
    write(tmp_path, bad, mtime=1000.1)
    for _ in range(3):
        mono.t += 0.3
        assert w.current().seq == 5
    assert len([r for r in caplog.records if "keeping last good" in r.message]) == 1


def test_directory_in_place_of_file_keeps_last_good(tmp_path):
    w, _, mono = watcher(tmp_path)
    write(tmp_path, good(seq=3))
    assert w.current().seq == 3
    os.unlink(tmp_path / SETTINGS_FILE)
    os.mkdir(tmp_path / SETTINGS_FILE)
    mono.t += 0.3
    assert w.current().seq == 3


@pytest.mark.parametrize("on_stale, expect_quota", [("open", None), ("hold", 1.5)])
def test_stale_file_fails_open_or_holds(tmp_path, on_stale, expect_quota):
    w, clock, mono = watcher(tmp_path, on_stale=on_stale)
    write(tmp_path, good(stale_after_seconds=10.0))
    assert w.current().cpu_quota_cores == 1.5
    clock.t += 11  # the sidecar stopped rewriting the file
    mono.t += 0.3
    assert w.current().cpu_quota_cores == expect_quota
    assert w.stale


def test_a_dead_sidecars_file_is_stale_even_if_the_clock_went_back(tmp_path):
    """The wall clock stepped back an hour after the sidecar died: by its mtime the file
    looked new for that hour, and the workload paced to a dead sidecar's rate. It is
    stale too once it has not changed for its stale_after_seconds."""
    w, clock, mono = watcher(tmp_path)
    write(tmp_path, good(stale_after_seconds=10.0))
    assert w.current().cpu_quota_cores == 1.5
    clock.t -= 3600   # the clock steps back; the file is never rewritten again
    mono.t += 5.0
    assert w.current().cpu_quota_cores == 1.5 and not w.stale
    mono.t += 6.0
    assert w.current().cpu_quota_cores is None and w.stale


def test_unknown_failure_behaviour_is_refused(tmp_path):
    with pytest.raises(ValueError, match="on_stale"):
        SettingsWatcher(str(tmp_path), on_stale="maybe")
