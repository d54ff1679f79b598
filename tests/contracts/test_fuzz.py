"""Hostile input to every parser: only the parser's own, named error may come out."""

from __future__ import annotations

import contextlib
import json
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from throttledjob.contracts.policy import PolicyError, load_policy_file, parse_policy
from throttledjob.contracts.settings import SETTINGS_FILE, Settings, SettingsError, parse_settings
from throttledjob.runtime.progress_files import read_progress
from throttledjob.runtime.settings_watch import SettingsWatcher

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                    st.text(max_size=20))
json_like = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=25)
SETTINGS_KEYS = ["schema", "seq", "time", "cpu_quota_cores", "max_pause_fraction", "threads",
                 "batch_scale", "rate_limit_per_second", "gpu_memory_fraction",
                 "dataloader_workers", "params", "stale_after_seconds"]
POLICY_KEYS = ["targets", "maxSlowdown", "mode", "enforcement", "intervalSeconds", "levers",
               "parameters"]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(SETTINGS_KEYS), json_like) | json_like)
def test_settings_parser_raises_only_settings_errors(obj):
    with contextlib.suppress(SettingsError):
        parse_settings({"schema": 1, **obj} if isinstance(obj, dict) else obj)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(POLICY_KEYS), json_like)
       | st.dictionaries(st.just("parameters"), st.dictionaries(st.text(max_size=70), json_like))
       | json_like)
def test_policy_parser_raises_only_policy_errors(doc):
    try:
        policy = parse_policy(doc)
    except PolicyError:
        return
    # Whatever a policy accepts must make valid settings for the workload.
    settings = Settings(seq=1, time=1.0, threads=policy.threads, batch_scale=policy.batch_scale,
                        rate_limit_per_second=policy.rate_limit_per_second,
                        gpu_memory_fraction=policy.gpu_memory_fraction,
                        max_pause_fraction=policy.max_pause_fraction, params=policy.params)
    assert parse_settings(json.loads(json.dumps(settings.to_dict()))) == settings


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_any_bytes_as_policy_file(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("p") / "policy.yaml"
    path.write_bytes(data)
    try:
        load_policy_file(str(path))
    except PolicyError as e:
        assert "\n" not in str(e)  # one clear line


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=300) | json_like.map(lambda o: json.dumps(o).encode()))
def test_any_bytes_as_settings_or_progress_file_never_raise(tmp_path_factory, data):
    directory = tmp_path_factory.mktemp("s")
    (directory / SETTINGS_FILE).write_bytes(data)
    (directory / "progress-123.json").write_bytes(data)
    SettingsWatcher(str(directory)).current()
    assert all(r.pid > 0 for r in read_progress(str(directory)))


PROGRESS_KEYS = ["schema", "pid", "steps", "time", "started", "paused_seconds", "cpu_seconds",
                 "pause_capped", "batch_size", "oom_events", "visible_devices"]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(PROGRESS_KEYS), json_like))
def test_progress_records_of_any_field_values_are_read_or_skipped(tmp_path_factory, obj):
    directory = tmp_path_factory.mktemp("p")
    (directory / "progress-123.json").write_text(json.dumps({"schema": 1, **obj}))
    assert all(0 < r.pid <= 1 << 22 for r in read_progress(str(directory)))


def test_progress_files_that_break_pythons_own_conversions_are_skipped(tmp_path):
    """1e400 decodes as inf (int() raises OverflowError), a pid past pid_max overflows
    os.kill, deep nesting raises RecursionError: each is skipped, the good one read. Any
    process of the pod may write here; one such file stopped every control cycle."""
    for name, text in (("progress-1.json", '{"schema": 1, "pid": 1, "steps": 1e400}'),
                       ("progress-2.json", '{"schema": 1, "pid": 99999999999999999999}'),
                       ("progress-3.json", '{"schema": 1, "pid": 3, "visible_devices": '
                                           + "[" * 100_000 + "]" * 100_000 + "}"),
                       ("progress-4.json", '{"schema": 1, "pid": 4, "steps": 7}')):
        (tmp_path / name).write_text(text)
    assert [(r.pid, r.steps) for r in read_progress(str(tmp_path))] == [(4, 7)]


def test_the_progress_written_last_is_read_when_there_are_too_many(tmp_path):
    """300 files of processes long gone (DataLoader workers of earlier epochs) beside the
    trainer's, whose name sorts last: the trainer's is read."""
    for pid in range(100, 400):
        (tmp_path / f"progress-{pid}.json").write_text(json.dumps({"schema": 1, "pid": pid}))
        os.utime(tmp_path / f"progress-{pid}.json", (1000.0, 1000.0))
    (tmp_path / "progress-7.json").write_text(json.dumps({"schema": 1, "pid": 7, "steps": 5}))
    records = read_progress(str(tmp_path))
    assert len(records) == 256 and (7, 5) in [(r.pid, r.steps) for r in records]


def test_deeply_nested_yaml_is_refused_in_bounded_time(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("[" * 20_000 + "]" * 20_000)
    try:
        load_policy_file(str(path))
    except PolicyError as e:
        assert "policy" in str(e)


def test_alias_bomb_is_not_expanded(tmp_path):
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        name, previous = chr(97 + i), chr(96 + i)
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{previous}"] * 10) + "]")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    try:
        load_policy_file(str(path))
    except PolicyError as e:
        assert "unknown field" in str(e)
    assert os.path.getsize(path) < 2000
