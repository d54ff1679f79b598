"""The policy schema shared by the CRD's spec.throttle, the sidecar and local mode."""

from __future__ import annotations

import dataclasses
import math

import pytest

from testing.manifests import policy_with
from throttledjob.contracts.policy import (
    POLICY_FIELDS,
    Policy,
    PolicyError,
    load_policy_file,
    parse_cpu_quantity,
    parse_policy,
)


@pytest.mark.parametrize("value, cores", [("1500m", 1.5), ("1.5", 1.5), (2, 2.0), ("250m", 0.25),
                                          (" 3 ", 3.0), (".5", 0.5)])
def test_cpu_quantities(value, cores):
    assert parse_cpu_quantity(value) == cores


@pytest.mark.parametrize("value", ["-1", "0", "abc", "1.5Gi", "", True, "1e3", "5m", 1e9, None])
def test_bad_cpu_quantities_are_refused(value):
    with pytest.raises(PolicyError, match="cpu peak"):
        parse_cpu_quantity(value)


def test_full_policy():
    p = parse_policy({
        "targets": {"cpu": {"peak": "1500m"},
                    "gpu": {"peakUtilizationPercent": 70, "peakPowerWatts": 300,
                            "memoryFraction": 0.8}},
        "maxSlowdown": 1.5, "mode": "Fixed", "enforcement": "Both", "intervalSeconds": 0.5,
        "levers": {"threads": 2, "batchScale": 0.5, "rateLimitPerSecond": 10},
        "parameters": {"workers": 4},
    })
    assert p == Policy(cpu_peak_cores=1.5, gpu_peak_utilization_percent=70,
                       gpu_peak_power_watts=300, gpu_memory_fraction=0.8, max_slowdown=1.5,
                       mode="fixed", enforcement="both", interval_seconds=0.5, threads=2,
                       batch_scale=0.5, rate_limit_per_second=10, params={"workers": 4})
    assert p.max_pause_fraction == pytest.approx(1 / 3)


def test_empty_policy_has_defaults():
    assert parse_policy(None) == Policy()


@pytest.mark.parametrize("doc, fragment", [
    ([], "policy must be a mapping"),
    ({"target": {}}, "unknown field 'target'"),
    ({"targets": {"cpu": {"peak": "1", "limit": 2}}}, "unknown field 'limit'"),
    ({"targets": {"gpu": {"peakUtilizationPercent": 150}}}, "peakUtilizationPercent=150"),
    ({"targets": {"gpu": {"memoryFraction": 0}}}, "memoryFraction"),
    ({"maxSlowdown": 0.9}, "maxSlowdown=0.9 is out of range"),
    ({"maxSlowdown": "fast"}, "maxSlowdown must be a number"),
    ({"maxSlowdown": float("nan")}, "maxSlowdown must be a finite number"),
    ({"mode": "Sometimes"}, "mode must be one of"),
    ({"enforcement": 3}, "enforcement must be one of"),
    ({"intervalSeconds": 0}, "intervalSeconds"),
    ({"levers": {"threads": 1.5}}, "levers.threads must be a whole number"),
    ({"levers": {"batchScale": 2}}, "batchScale"),
    ({"targets": "lots"}, "targets must be a mapping"),
    ({"parameters": {"a": [1]}}, "parameters.a must be a finite number"),
    ({"parameters": {"a": float("inf")}}, "parameters.a must be a finite number"),
    ({"parameters": {"": 1}}, "must be 1-63 characters"),
])
def test_bad_policies_are_refused_with_the_field_named(doc, fragment):
    with pytest.raises(PolicyError, match=fragment.replace("(", r"\(")):
        parse_policy(doc)


def test_policy_file(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("targets:\n  cpu: {peak: 750m}\nenforcement: Signals\n")
    assert load_policy_file(str(f)) == Policy(cpu_peak_cores=0.75, enforcement="signals")


@pytest.mark.parametrize("content, fragment", [
    ("targets: [", "not valid YAML"),
    ("!!python/object/apply:os.system ['echo pwned']", "not valid YAML"),
    ("maxSlowdown: 7000", "maxSlowdown=7000"),
    ("a: &a [*a, *a]\n", "unknown field"),
])
def test_bad_policy_files(tmp_path, content, fragment):
    f = tmp_path / "p.yaml"
    f.write_text(content)
    with pytest.raises(PolicyError, match=fragment) as e:
        load_policy_file(str(f))
    assert str(f) in str(e.value) and "\n" not in str(e.value)


def test_huge_and_missing_policy_files(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("# " + "x" * 100_000)
    with pytest.raises(PolicyError, match="larger than"):
        load_policy_file(str(f))
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy_file(str(tmp_path / "missing.yaml"))


def test_overrides_are_validated():
    with pytest.raises(PolicyError, match="maxSlowdown"):
        Policy().with_overrides(max_slowdown=0.5)
    assert Policy().with_overrides(cpu_peak_cores=2.0, mode=None).cpu_peak_cores == 2.0
    # A changed field is named as the caller names it (the command line: its flag) ...
    with pytest.raises(PolicyError, match=r"^--max-slowdown=0.5 is out of range"):
        Policy().with_overrides(names={"max_slowdown": "--max-slowdown"}, max_slowdown=0.5)
    # ... and only a changed one: a name for a field left alone is never used.
    with pytest.raises(PolicyError, match=r"^maxSlowdown=0.5 is out of range"):
        Policy(max_slowdown=0.5).with_overrides(names={"max_slowdown": "--max-slowdown"},
                                               interval_seconds=2.0)


def test_the_table_is_every_field_of_the_policy_once():
    attrs = [f.attr for f in POLICY_FIELDS]
    # `params` is the operator's: spec.parameters' values, not a field of spec.throttle.
    assert sorted(attrs) == sorted(f.name for f in dataclasses.fields(Policy)
                                   if f.name != "params")
    assert len({f.path for f in POLICY_FIELDS}) == len(POLICY_FIELDS)
    for f in POLICY_FIELDS:
        assert f.type in ("number", "integer", "choice", "cpu"), f.path
        if f.type == "choice":
            assert f.choices and f.default in f.choices, f.path
        else:
            assert f.minimum is not None and f.maximum is not None, f.path
            assert f.minimum < f.maximum, f.path
        assert f.description.endswith("."), f.path


@pytest.mark.parametrize("f", [f for f in POLICY_FIELDS if f.type in ("number", "integer")],
                         ids=lambda f: f.path)
def test_each_number_is_accepted_at_its_bounds_and_refused_past_them(f):
    for value in (f.minimum, f.maximum):
        assert getattr(parse_policy(policy_with(f.path, value)), f.attr) == value
    step = 1 if f.type == "integer" else 0
    for value, toward in ((f.minimum - step, -math.inf), (f.maximum + step, math.inf)):
        value = value if step else math.nextafter(value, toward)
        with pytest.raises(PolicyError, match=rf"^{f.path}={value} is out of range"):
            parse_policy(policy_with(f.path, value))
    with pytest.raises(PolicyError, match=rf"^{f.path} must be a number, got 'x'"):
        parse_policy(policy_with(f.path, "x"))
    if f.type == "integer":
        with pytest.raises(PolicyError, match=rf"^{f.path} must be a whole number"):
            parse_policy(policy_with(f.path, f.minimum + 0.5))


def test_nice_and_cpu_affinity_reach_the_policy():
    p = parse_policy({"levers": {"nice": 10, "cpuAffinity": 2}})
    assert (p.nice, p.cpu_affinity) == (10, 2)


def test_a_choice_is_read_in_any_case_and_refused_by_its_name():
    for f in (f for f in POLICY_FIELDS if f.type == "choice"):
        for choice in f.choices:
            assert getattr(parse_policy(policy_with(f.path, choice.upper())), f.attr) == choice
        with pytest.raises(PolicyError, match=rf"^{f.path} must be one of"):
            parse_policy(policy_with(f.path, None))
