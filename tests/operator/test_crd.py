"""The CRD: generated from operator/crd.py, valid, structural, and it refuses bad specs
with the expected message (OpenAPI part by jsonschema, CEL part by cel-python)."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from throttledjob.operator import crd

from .cel import cel_errors
from .conftest import ROOT, cr_errors, k8s_validate, make_tj

SCHEMA = crd.openapi_schema()


def all_errors(obj: dict[str, Any]) -> list[str]:
    """What the API server would answer: schema errors, then (if none) CEL errors."""
    return cr_errors(obj) or cel_errors(obj, SCHEMA)


def test_chart_crd_file_is_generated_from_the_source() -> None:
    path = ROOT / crd.CRD_FILE
    assert path.read_text() == crd.render_yaml(), (
        "run: python -m throttledjob.operator.crd --write")
    assert yaml.safe_load(path.read_text()) == crd.build_crd()


def test_generator_check_mode_detects_drift(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "throttledjob.operator.crd", "--root", str(tmp_path)]
    assert subprocess.run([*cmd, "--check"], capture_output=True).returncode == 1
    assert subprocess.run([*cmd, "--write"]).returncode == 0
    assert subprocess.run([*cmd, "--check"]).returncode == 0
    target = tmp_path / crd.CRD_FILE
    target.write_text(target.read_text().replace("maximum: 100", "maximum: 1000"))
    result = subprocess.run([*cmd, "--check"], capture_output=True, text=True)
    assert result.returncode == 1 and "out of date" in result.stderr


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
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Phase", "CPU-Peak", "GPU-Peak", "Throttle", "Age"]
    # Every column's path exists in the schema, so the column is never always empty.
    for column in version["additionalPrinterColumns"]:
        node = SCHEMA
        for part in column["jsonPath"].strip(".").split("."):
            node = (node.get("properties") or {}).get(part, {"type": "object"})
        assert node.get("type"), column


def test_every_cel_rule_compiles_and_defaults_satisfy_the_rules() -> None:
    assert all_errors(make_tj()) == []
    minimal = make_tj(throttle={"targets": {"cpu": {"peak": 2}}})
    assert all_errors(minimal) == []


def _doc_examples() -> list[dict[str, Any]]:
    """ThrottledJob manifests in docs/operator.md and examples/ (kept valid by this test)."""
    docs = []
    sources = [ROOT / "docs" / "operator.md", *sorted((ROOT / "examples").rglob("*.yaml"))]
    for path in sources:
        if not path.is_file():
            continue
        text = path.read_text()
        blocks = re.findall(r"```yaml\n(.*?)```", text, re.S) if path.suffix == ".md" else [text]
        for block in blocks:
            for doc in yaml.safe_load_all(block):
                if isinstance(doc, dict) and doc.get("kind") == crd.KIND:
                    docs.append(doc)
    return docs


def test_documented_examples_are_valid() -> None:
    examples = _doc_examples()
    assert examples, "docs/operator.md shows at least one ThrottledJob"
    for doc in examples:
        assert all_errors(doc) == [], doc["metadata"]["name"]


def _set(obj: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    node = obj
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if value is _DELETE:
        del node[parts[-1]]
    else:
        node[parts[-1]] = value
    return obj


_DELETE = object()
POD = "spec.jobTemplate.spec.template.spec"
BAD = [
    ("spec.throttle", _DELETE, "'throttle' is a required property"),
    ("spec.jobTemplate", _DELETE, "'jobTemplate' is a required property"),
    ("spec.throttle.maxSlowdown", 0.9, "less than the minimum of 1"),
    ("spec.throttle.maxSlowdown", 101, "greater than the maximum of 100"),
    ("spec.throttle.maxSlowdown", "1.2", "is not of type 'number'"),
    ("spec.throttle.mode", "Turbo", "is not one of ['Adaptive', 'Fixed']"),
    ("spec.throttle.enforcement", "cooperative", "is not one of"),
    ("spec.throttle.intervalSeconds", 0.01, "less than the minimum of 0.05"),
    ("spec.throttle.intervalSeconds", 7200, "greater than the maximum of 3600"),
    ("spec.throttle.targets.cpu.peak", "1.5 cores", "peak must be a CPU quantity"),
    ("spec.throttle.targets.cpu.peak", "-1", "peak must be a CPU quantity"),
    ("spec.throttle.targets.cpu.peak", 0, "peak must be a CPU quantity"),
    ("spec.throttle.targets.cpu.peak", "9" * 40, "peak must be a CPU quantity"),
    ("spec.throttle.targets.cpu.peak", True, "is not of type"),
    ("spec.throttle.targets.cpu", {}, "'peak' is a required property"),
    ("spec.throttle.targets.gpu", {}, "targets.gpu needs at least one of"),
    ("spec.throttle.targets.gpu.peakUtilizationPercent", 150, "greater than the maximum"),
    ("spec.throttle.targets.gpu.peakPowerWatts", 0, "less than the minimum"),
    ("spec.throttle.targets.gpu.memoryFraction", 1.5, "greater than the maximum"),
    ("spec.throttle.targets", {}, "mode Adaptive needs a target"),
    ("spec.throttle.levers.threads", 1.5, "is not of type 'integer'"),
    ("spec.throttle.levers.batchScale", 2, "greater than the maximum of 1"),
    ("spec.throttle.turbo", True, "Additional properties are not allowed"),
    ("spec.throttle.parameters", {"lr": 0.1}, "Additional properties are not allowed"),
    ("spec.parameters", {"lr": {"type": "Float", "value": 1}}, "is not one of"),
    ("spec.parameters", {"lr": {"value": 1}}, "'type' is a required property"),
    ("spec.parameters", {"9lives": {"type": "Integer", "value": 9}},
     "parameter names are identifiers"),
    ("spec.parameters", {"n": {"type": "Integer", "value": 5, "min": 9, "max": 1}},
     "min must not exceed max"),
    ("spec.parameters", {"s": {"type": "String", "value": "a", "min": 1}},
     "min and max apply to Integer and Number"),
    ("spec.parameters", {"n": {"type": "Integer", "value": 1, "choices": ["1"]}},
     "choices apply to String parameters only"),
    (f"{POD}.containers", [], "should be non-empty"),
    (f"{POD}.restartPolicy", "Always", "is not one of ['Never', 'OnFailure']"),
    (f"{POD}.restartPolicy", _DELETE, "'restartPolicy' is a required property"),
    (f"{POD}.containers.0.name", "throttledjob-sidecar", "are reserved for the injected"),
    (f"{POD}.containers.0.name", "throttledjob-inject", "are reserved for the injected"),
    (f"{POD}.initContainers", [{"name": "throttledjob-sidecar"}], "are reserved"),
    ("spec.throttle.inject", "Always", "is not one of ['Auto', 'None']"),
    ("spec.throttle.inject", "auto", "is not one of ['Auto', 'None']"),
    ("spec.jobTemplate.metadata.labels", {"team": 7}, "is not of type 'string'"),
    ("metadata.name", "x" * 64, "the name must be at most 63 characters"),
]


@pytest.mark.parametrize(("path", "value", "message"), BAD,
                         ids=[f"{p}={str(v)[:20]}" for p, v, _ in BAD])
def test_bad_throttledjobs_are_refused_with_a_clear_message(path: str, value: Any,
                                                            message: str) -> None:
    obj = _set(copy.deepcopy(make_tj()), path, value)
    errors = all_errors(obj)
    assert any(message in e for e in errors), errors


def test_status_schema_accepts_what_the_builders_write() -> None:
    from throttledjob.operator import builders as b

    now = "2026-01-01T00:00:00Z"
    st = b.status_job_created({}, "train", 1, now)
    st = b.status_from_job(st, {"active": 1, "startTime": now}, now)
    st = b.status_with_observed(st, [{"observed": {
        "cpuPeakCores": 1.2, "cpuMaxCores": 1.5, "gpuPeakUtilizationPercent": None,
        "gpuPeakPowerWatts": None, "throttleLevel": 0.3, "slowdown": 1.1},
        "targetMet": True, "budgetExhausted": False, "levers": [], "errors": []}], [], now)
    assert cr_errors({**make_tj(), "status": st}) == []
    bad = {**make_tj(), "status": {**st, "phase": "Exploded"}}
    assert any("is not one of" in e for e in cr_errors(bad))
