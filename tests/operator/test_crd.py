"""The CRD: generated from operator/crd.py, valid and structural. What the API server
accepts and refuses is tested on a real one (tests/cluster/test_crd_live.py)."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from testing.manifests import make_tj, policy_with
from testing.paths import ROOT
from testing.validation import cr_errors, k8s_validate
from throttledjob.contracts.policy import (
    CPU_QUANTITY_PATTERN,
    POLICY_FIELDS,
    PolicyError,
    parse_cpu_quantity,
    parse_policy,
)
from throttledjob.contracts.status import OBSERVED, OBSERVED_NAMES, Aggregate
from throttledjob.operator import api_names, crd
from throttledjob.operator.conditions import status_job_created
from throttledjob.operator.observed import aggregate_observed, status_with_observed

SCHEMA = crd.openapi_schema()
NOW = "2026-01-01T00:00:00Z"


def test_chart_crd_file_is_generated_from_the_source() -> None:
    path = ROOT / api_names.CRD_FILE
    assert path.read_text() == crd.render_yaml(), (
        "run: python -m throttledjob.operator.crd --write")
    assert yaml.safe_load(path.read_text()) == crd.build_crd()


def test_generator_check_mode_detects_drift(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "throttledjob.operator.crd", "--root", str(tmp_path)]
    assert subprocess.run([*cmd, "--check"], capture_output=True).returncode == 1
    assert subprocess.run([*cmd, "--write"]).returncode == 0
    assert subprocess.run([*cmd, "--check"]).returncode == 0
    target = tmp_path / api_names.CRD_FILE
    target.write_text(target.read_text().replace("maximum: 100", "maximum: 1000"))
    result = subprocess.run([*cmd, "--check"], capture_output=True, text=True)
    assert result.returncode == 1 and "out of date" in result.stderr
    assert subprocess.run([*cmd, "--write"]).returncode == 0
    rule = tmp_path / crd.CPU_RULE_FILE
    rule.write_text(rule.read_text().replace("4096", "4097"))
    result = subprocess.run([*cmd, "--check"], capture_output=True, text=True)
    assert result.returncode == 1 and "_cpu_peak_rule.tpl is out of date" in result.stderr


def test_crd_is_a_valid_kubernetes_object() -> None:
    k8s_validate(crd.build_crd())


def _structural_problems(schema: dict[str, Any], path: str = "") -> list[str]:
    """Kubernetes' structural-schema rules that matter here: every node has a type
    (unless int-or-string or preserve-unknown-fields), no additionalProperties beside
    properties, defaults only where a type is given."""
    problems = []
    if not schema.get("type") and not schema.get("x-kubernetes-int-or-string") \
            and not schema.get("x-kubernetes-preserve-unknown-fields"):
        problems.append(f"{path or '/'}: no type")
    if "properties" in schema and "additionalProperties" in schema:
        problems.append(f"{path}: properties and additionalProperties together")
    for key, sub in (schema.get("properties") or {}).items():
        problems += _structural_problems(sub, f"{path}.{key}")
    if isinstance(schema.get("additionalProperties"), dict):
        problems += _structural_problems(schema["additionalProperties"], f"{path}.*")
    if isinstance(schema.get("items"), dict):
        problems += _structural_problems(schema["items"], f"{path}[]")
    return problems


def test_schema_is_structural() -> None:
    assert _structural_problems(SCHEMA) == []


def test_crd_names_columns_and_status_subresource() -> None:
    spec = crd.build_crd()["spec"]
    assert spec["names"]["shortNames"] == ["tj"]
    version = spec["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = version["additionalPrinterColumns"]
    assert [c["name"] for c in columns if not c.get("priority")] == [
        "Phase", "CPU-Target", "CPU-Peak", "Target-Met", "Slowdown", "Throttle", "Age"]
    assert [c["name"] for c in columns if c.get("priority")] == [
        "GPU-Peak", "Job-CPU-Peak", "Levers", "Steps"]   # -o wide
    # Every column's path exists in the schema, so the column is never always empty (a
    # condition's by its filter on the conditions' list; metadata is the API server's own).
    for column in columns:
        if column["jsonPath"].startswith(".metadata."):
            continue
        node = SCHEMA
        for part in re.sub(r"\[\?\(.*?\)\]", "[]", column["jsonPath"]).strip(".").split("."):
            node = (node.get("properties") or {}).get(part.removesuffix("[]")) or {}
            if part.endswith("[]"):   # a filter on a list: its items
                assert node.get("type") == "array", column
                node = node["items"]
        assert node.get("type") or node.get("x-kubernetes-int-or-string") or node.get(
            "x-kubernetes-preserve-unknown-fields"), column


def test_status_schema_accepts_what_the_builders_write() -> None:
    from throttledjob.operator.conditions import status_from_job, status_job_created
    from throttledjob.operator.observed import status_with_observed

    now = "2026-01-01T00:00:00Z"
    st = status_job_created({}, "train", 1, now)
    st = status_from_job(st, {"status": {"active": 1, "startTime": now}}, {}, now)
    st = status_with_observed(st, [{"observed": {
        "cpuPeakCores": 1.2, "cpuMaxCores": 1.5, "gpuPeakUtilizationPercent": None,
        "gpuPeakPowerWatts": None, "throttleLevel": 0.3, "slowdown": 1.1, "steps": 42},
        "targetMet": True, "budgetExhausted": False, "levers": ["quota", "threads"],
        "errors": []}], [], now)
    assert st["observed"]["levers"] == ["quota", "threads"]
    assert cr_errors({**make_tj(), "status": st}) == []
    bad = {**make_tj(), "status": {**st, "phase": "Exploded"}}
    assert any("is not one of" in e for e in cr_errors(bad))


def _observed_reports(pods: list[float]) -> list[dict[str, Any]]:
    """One /status document per pod, every field of the table set to the pod's figure."""
    def value(f: Any, v: float) -> float | int:
        return int(v * 10) if f.type == "integer" and math.isfinite(v) else v

    return [{"observed": {f.name: value(f, v) for f in OBSERVED},
             "targetMet": True, "budgetExhausted": False, "levers": [], "errors": []}
            for v in pods]


def test_status_observed_is_the_tables_fields_the_operator_aggregates() -> None:
    properties = SCHEMA["properties"]["status"]["properties"]["observed"]["properties"]
    for f in OBSERVED:
        if f.aggregate is Aggregate.POD:
            # The API server would prune it: the operator must not write it either.
            assert f.name not in properties, f.name
            continue
        node = properties[f.name]
        assert (node["type"], node.get("nullable", False)) == (f.type, f.nullable), f.name
        assert (node.get("minimum"), node.get("maximum")) == (f.minimum, f.maximum), f.name
    observed = status_with_observed({}, _observed_reports([0.25, 0.5]), [], NOW)["observed"]
    carried = {f.name for f in OBSERVED if f.aggregate is not Aggregate.POD}
    assert carried <= set(observed) and not (set(OBSERVED_NAMES) - carried) & set(observed)


def test_each_observed_field_is_folded_over_the_pods_as_the_table_says() -> None:
    observed = aggregate_observed(_observed_reports([0.25, 0.5]), [], NOW)
    for f in OBSERVED:
        if f.aggregate is Aggregate.WORST:
            assert observed[f.name] == 0.5, f.name
        elif f.aggregate is Aggregate.SUM:
            assert observed[f.name] == 2 + 5, f.name


def test_observed_gpus_are_the_pods_gpus_once_each_and_within_the_crds_bounds() -> None:
    a, b = _observed_reports([0.25, 0.5])
    a["telemetry"] = {"gpus": [{"gpu": 0, "UUID": "GPU-b"}, {"gpu": 1, "UUID": "GPU-a"}]}
    b["telemetry"] = {"gpus": [{"gpu": 0, "UUID": "GPU-a"}, {"gpu": 1}, "junk"]}
    assert aggregate_observed([a, b], [], NOW)["gpus"] == ["GPU-a", "GPU-b"]
    assert aggregate_observed(_observed_reports([0.5]), [], NOW)["gpus"] is None
    # A JobSet larger than the list: the API server still takes the status.
    b["telemetry"] = {"gpus": [{"UUID": f"GPU-{i:03}" + "x" * 100} for i in range(200)]}
    st = status_with_observed(status_job_created({}, "train", 1, NOW), [a, b], [], NOW)
    assert len(st["observed"]["gpus"]) == 64
    assert cr_errors({**make_tj(), "status": st}) == []


def test_observed_figures_out_of_the_crds_bounds_are_kept_within_them() -> None:
    # A sidecar is another program: what it sends must not make the API server refuse
    # the whole status patch.
    for pods in ([1e6, -1e6], [-1e6], [math.nan]):
        st = status_with_observed(status_job_created({}, "train", 1, NOW),
                                  _observed_reports(pods), [], NOW)
        assert cr_errors({**make_tj(), "status": st}) == [], pods


THROTTLE = SCHEMA["properties"]["spec"]["properties"]["throttle"]


def _throttle_node(path: str) -> dict[str, Any]:
    node = THROTTLE
    for part in path.split("."):
        node = node["properties"][part]
    return node


def _throttle_leaves(node: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, sub in node.get("properties", {}).items():
        path = f"{prefix}{key}"
        out += _throttle_leaves(sub, f"{path}.") if sub.get("type") == "object" else [path]
    return out


def test_spec_throttle_is_the_policy_table_inject_and_scope() -> None:
    assert sorted(_throttle_leaves(THROTTLE)) == sorted(
        [f.path for f in POLICY_FIELDS] + ["inject", "scope"])
    for f in POLICY_FIELDS:
        node = _throttle_node(f.path)
        assert node["description"] == f.description, f.path
        if f.type in ("number", "integer"):
            assert (node["type"], node["minimum"], node["maximum"]) == (
                f.type, f.minimum, f.maximum), f.path
        if f.type == "choice":
            assert [c.lower() for c in node["enum"]] == list(f.choices), f.path
        if f.crd_default:
            assert parse_policy(policy_with(f.path, node["default"])) == parse_policy({}), f.path
        else:
            assert "default" not in node, f.path


def _parser_accepts(throttle: dict[str, Any]) -> bool:
    try:
        parse_policy(throttle)
    except PolicyError:
        return False
    return True


def _crd_accepts(throttle: dict[str, Any]) -> bool:
    return cr_errors(make_tj(throttle=throttle)) == []


def test_the_crd_and_the_parser_agree_at_every_bound() -> None:
    for f in POLICY_FIELDS:
        if f.type in ("number", "integer"):
            whole = f.type == "integer"
            cases = [(f.minimum, True), (f.maximum, True),
                     (f.minimum - 1 if whole else math.nextafter(f.minimum, -math.inf), False),
                     (f.maximum + 1 if whole else math.nextafter(f.maximum, math.inf), False),
                     ("1", False)] + ([(f.minimum + 0.5, False)] if whole else [])
        elif f.type == "choice":
            cases = [*((c.capitalize(), True) for c in f.choices), ("Sometimes", False)]
        else:
            continue  # a CPU quantity: its CEL rule, below
        for value, accepted in cases:
            throttle = policy_with(f.path, value)
            assert (_crd_accepts(throttle), _parser_accepts(throttle)) == (
                accepted, accepted), (f.path, value)


def test_the_cpu_peak_rule_is_the_parsers_grammar_and_bounds() -> None:
    (f,) = [f for f in POLICY_FIELDS if f.type == "cpu"]
    # The chart's admission policy holds it (the CRD keeps any value: a number or a string).
    assert _throttle_node(f.path).get("x-kubernetes-preserve-unknown-fields") is True
    rule = {"rule": crd.cpu_quantity_rule(f, "self")}
    assert crd.cpu_quantity_rule(f, "variables.cpuPeak") in (
        ROOT / crd.CPU_RULE_FILE).read_text()
    literal = re.search(r"matches\('(.*?)'\)", rule["rule"]).group(1)
    # A CEL string knows no escape `\.`: every backslash must come doubled.
    assert "\\" not in literal.replace("\\\\", "")
    assert literal.replace("\\\\", "\\") == CPU_QUANTITY_PATTERN
    low, high = (int(n) for n in re.search(
        r"self >= (\d+) && self <= (\d+)", rule["rule"]).groups())
    assert parse_cpu_quantity(low) and parse_cpu_quantity(high)
    for outside in (low - 1, high + 1):
        with pytest.raises(PolicyError):
            parse_cpu_quantity(outside)
    # A string's bounds too (the live test has the API server refuse "5m" and "5000").
    (smallest,) = set(re.findall(r"\) >= ([0-9.]+)", rule["rule"]))
    (largest,) = set(re.findall(r"\) <= ([0-9.]+)$", rule["rule"]))
    assert (float(smallest), float(largest)) == (f.minimum, f.maximum)
    # And a number's (`peak: 1.5`), the same.
    assert f"self >= {float(f.minimum)!r} && self <= {float(f.maximum)!r}" in rule["rule"]
    for outside in (f"{float(smallest) * 1000 - 1:g}m", f"{float(largest) + 1:g}"):
        with pytest.raises(PolicyError):
            parse_cpu_quantity(outside)


def test_nice_and_cpu_affinity_pass_the_crd_and_reach_the_sidecars_policy() -> None:
    from throttledjob.operator.validation import policy_document

    tj = make_tj(throttle={"targets": {"cpu": {"peak": "1"}},
                           "levers": {"nice": 10, "cpuAffinity": 2}})
    assert cr_errors(tj) == []
    policy = parse_policy(policy_document(tj["spec"]))
    assert (policy.nice, policy.cpu_affinity) == (10, 2)


def test_kubectl_explain_has_something_to_say_of_every_field() -> None:
    """Every node of the schema but apiVersion, kind, metadata and an array's items (its
    field says what they are) has a description: 57 had none, the kind itself among
    them."""
    from throttledjob.operator.crd import build_crd

    silent = []

    def walk(node: dict[str, Any], path: str) -> None:
        if "description" not in node and path.rsplit(".", 1)[-1] not in (
                "apiVersion", "kind", "metadata") and not path.endswith("[]"):
            silent.append(path or "(the kind)")
        for name, child in (node.get("properties") or {}).items():
            walk(child, f"{path}.{name}" if path else name)
        if isinstance(node.get("items"), dict):
            walk(node["items"], path + "[]")

    (version,) = build_crd()["spec"]["versions"]
    walk(version["schema"]["openAPIV3Schema"], "")
    assert silent == []
