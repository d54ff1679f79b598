"""The CRD: generated from operator/crd.py, valid and structural. What the API server
accepts and refuses is tested on a real one (tests/cluster/test_crd_live.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from testing.manifests import make_tj
from testing.paths import ROOT
from testing.validation import cr_errors, k8s_validate
from throttledjob.operator import crd

SCHEMA = crd.openapi_schema()


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
        "Phase", "CPU-Peak", "GPU-Peak", "Throttle", "Levers", "Steps", "Age"]
    # Every column's path exists in the schema, so the column is never always empty.
    for column in version["additionalPrinterColumns"]:
        node = SCHEMA
        for part in column["jsonPath"].strip(".").split("."):
            node = (node.get("properties") or {}).get(part, {"type": "object"})
        assert node.get("type"), column


def test_status_schema_accepts_what_the_builders_write() -> None:
    from throttledjob.operator.status import (
        status_from_job,
        status_job_created,
        status_with_observed,
    )

    now = "2026-01-01T00:00:00Z"
    st = status_job_created({}, "train", 1, now)
    st = status_from_job(st, {"active": 1, "startTime": now}, now)
    st = status_with_observed(st, [{"observed": {
        "cpuPeakCores": 1.2, "cpuMaxCores": 1.5, "gpuPeakUtilizationPercent": None,
        "gpuPeakPowerWatts": None, "throttleLevel": 0.3, "slowdown": 1.1, "steps": 42},
        "targetMet": True, "budgetExhausted": False, "levers": ["quota", "threads"],
        "errors": []}], [], now)
    assert st["observed"]["levers"] == ["quota", "threads"]
    assert cr_errors({**make_tj(), "status": st}) == []
    bad = {**make_tj(), "status": {**st, "phase": "Exploded"}}
    assert any("is not one of" in e for e in cr_errors(bad))
