"""The CRD as the API server itself applies it: OpenAPI schema, CEL rules and strict field
validation (kubectl's default), on the chart's CRD file."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import yaml

from testing.cluster_cli import Kubectl
from testing.manifests import make_tj
from testing.paths import ROOT
from throttledjob.operator import api_names
from throttledjob.operator.spec_rules import broken_spec, broken_throttle


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
                if isinstance(doc, dict) and doc.get("kind") == api_names.KIND:
                    docs.append(doc)
    return docs


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
# The API server's own words: its OpenAPI checks, then the CRD's CEL rules (their
# messages are ours, in operator/crd.py).
BAD = [
    ("spec.throttle", _DELETE, "spec.throttle: Required value"),
    ("spec.jobTemplate", _DELETE, "set exactly one of jobTemplate (a Job), "
                                  "jobSetTemplate (a JobSet), workloadRef"),
    ("spec.jobSetTemplate", {"spec": {"replicatedJobs": [{"name": "w", "template": {
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "w"}]}}}}}]}}, "set exactly one of jobTemplate"),
    ("spec.jobSetTemplate", {"spec": {"replicatedJobs": []}}, "should have at least 1 items"),
    ("spec.throttle.maxSlowdown", 0.9, "should be greater than or equal to 1"),
    ("spec.throttle.maxSlowdown", 101, "should be less than or equal to 100"),
    ("spec.throttle.maxSlowdown", "1.2", "must be of type number"),
    ("spec.throttle.mode", "Turbo", 'Unsupported value: "Turbo"'),
    ("spec.throttle.enforcement", "cooperative", 'Unsupported value: "cooperative"'),
    ("spec.throttle.intervalSeconds", 0.01, "should be greater than or equal to 0.05"),
    ("spec.throttle.intervalSeconds", 7200, "should be less than or equal to 3600"),
    ("spec.throttle.targets.cpu", {}, "spec.throttle.targets.cpu.peak: Required value"),
    ("spec.throttle.targets.gpu", {}, "targets.gpu needs at least one of"),
    ("spec.throttle.targets.gpu.peakUtilizationPercent", 150,
     "should be less than or equal to 100"),
    ("spec.throttle.targets.gpu.peakPowerWatts", 0, "should be greater than or equal to"),
    ("spec.throttle.targets.gpu.memoryFraction", 1.5, "should be less than or equal to 1"),
    ("spec.throttle.targets", {}, "mode Adaptive needs a target"),
    ("spec.throttle.levers.threads", 1.5, "must be of type integer"),
    ("spec.throttle.levers.batchScale", 2, "should be less than or equal to 1"),
    ("spec.throttle.levers.nice", 20, "should be less than or equal to 19"),
    ("spec.throttle.levers.cpuAffinity", 0, "should be greater than or equal to 1"),
    ("spec.throttle.turbo", True, 'unknown field "spec.throttle.turbo"'),
    ("spec.throttle.parameters", {"lr": 0.1}, 'unknown field "spec.throttle.parameters"'),
    ("spec.parameters", {"lr": {"type": "Float", "value": 1}}, 'Unsupported value: "Float"'),
    ("spec.parameters", {"lr": {"value": 1}}, "spec.parameters.lr.type: Required value"),
    ("spec.parameters", {"9lives": {"type": "Integer", "value": 9}},
     "parameter names are identifiers"),
    ("spec.parameters", {"n": {"type": "Integer", "value": 5, "min": 9, "max": 1}},
     "min must not exceed max"),
    ("spec.parameters", {"s": {"type": "String", "value": "a", "min": 1}},
     "min and max apply to Integer and Number"),
    ("spec.parameters", {"n": {"type": "Integer", "value": 1, "choices": ["1"]}},
     "choices apply to String parameters only"),
    (f"{POD}.containers", [], "should have at least 1 items"),
    (f"{POD}.restartPolicy", "Always", 'Unsupported value: "Always"'),
    (f"{POD}.restartPolicy", _DELETE, f"{POD}.restartPolicy: Required value"),
    (f"{POD}.containers.0.name", "throttledjob-sidecar", "are reserved for the injected"),
    (f"{POD}.containers.0.name", "throttledjob-inject", "are reserved for the injected"),
    (f"{POD}.initContainers", [{"name": "throttledjob-sidecar"}], "are reserved"),
    ("spec.throttle.inject", "Always", 'Unsupported value: "Always"'),
    ("spec.throttle.inject", "auto", 'Unsupported value: "auto"'),
    ("spec.throttle.scope", "job", 'Unsupported value: "job"'),
    ("spec.throttle.scope", "Job", "scope Job is held by the pods' CPU limits: enforcement "
                                   "must be Quota"),
    ("spec.jobTemplate.metadata.labels", {"team": 7}, "must be of type string"),
    ("metadata.name", "x" * 64, "metadata.name: Too long"),
]


def dry_run_create(kubectl: Kubectl, obj: dict[str, Any]) -> tuple[bool, str]:
    proc = kubectl("create", "--dry-run=server", "--validate=strict", "-f", "-",
                   stdin=yaml.safe_dump(obj), check=False)
    return proc.returncode == 0, proc.stderr


def test_documented_examples_are_accepted(kubectl: Kubectl, crd_installed: None,
                                          namespace: str) -> None:
    # A CPU peak as a Pod takes one: a number too (its form is the chart's admission
    # policy's to judge: tests/cluster/test_admission_live.py).
    examples = [*_doc_examples(), make_tj(), make_tj(throttle={"targets": {"cpu": {"peak": 2}}}),
                make_tj(throttle={"targets": {"cpu": {"peak": 1.5}}})]
    assert len(examples) > 3, "docs/operator.md and examples/ show ThrottledJobs"
    for doc in examples:
        doc = copy.deepcopy(doc)
        doc["metadata"]["namespace"] = namespace
        ok, err = dry_run_create(kubectl, doc)
        assert ok, f"{doc['metadata']['name']}: {err}"


@pytest.mark.parametrize(("path", "value", "message"), BAD,
                         ids=[f"{p}={str(v)[:20]}" for p, v, _ in BAD])
def test_bad_throttledjobs_are_refused_with_a_clear_message(
        kubectl: Kubectl, crd_installed: None, path: str, value: Any, message: str) -> None:
    obj = _set(copy.deepcopy(make_tj()), path, value)
    obj["metadata"]["namespace"] = "default"
    ok, err = dry_run_create(kubectl, obj)
    assert not ok, f"accepted: {path}={value!r}"
    assert message in err, err


def job_wide(**throttle: Any) -> dict[str, Any]:
    obj = make_tj(throttle={"targets": {"cpu": {"peak": "1"}}, "enforcement": "Quota",
                            "scope": "Job", **throttle})
    obj["spec"]["jobTemplate"]["spec"].update(completionMode="Indexed", completions=2,
                                              parallelism=2)
    obj["metadata"]["namespace"] = "default"
    return obj


def test_a_job_wide_target_is_accepted_and_what_it_cannot_hold_is_refused(
        kubectl: Kubectl, crd_installed: None) -> None:
    assert dry_run_create(kubectl, job_wide()) == (True, "")
    of_a_jobset = job_wide()
    job = of_a_jobset["spec"].pop("jobTemplate")
    of_a_jobset["spec"]["jobSetTemplate"] = {"spec": {"replicatedJobs": [
        {"name": "worker", "replicas": 2, "template": job}]}}
    assert dry_run_create(kubectl, of_a_jobset) == (True, "")
    gpu = job_wide(targets={"cpu": {"peak": "1"}, "gpu": {"peakPowerWatts": 200}})
    too_many = job_wide()
    too_many["spec"]["jobTemplate"]["spec"].update(completions=65, parallelism=65)
    no_cpu = job_wide(targets={"gpu": {"peakPowerWatts": 200}})
    for obj, message in ((gpu, "a job-wide GPU target is not supported yet"),
                         (no_cpu, "scope Job holds a CPU target over the whole Job"),
                         (too_many, "jobTemplate.spec.parallelism must be at most 64")):
        ok, err = dry_run_create(kubectl, obj)
        assert not ok and message in err, err


def rule_cases() -> list[tuple[str, dict[str, Any]]]:
    """Specs on both sides of each rule of operator/spec_rules.py, defaults included."""
    no_target = make_tj(throttle={"targets": {}})
    fixed = make_tj(throttle={"targets": {}, "mode": "Fixed"})
    defaulted_quota = job_wide()
    del defaulted_quota["spec"]["throttle"]["enforcement"]
    both = make_tj()
    both["spec"]["jobSetTemplate"] = {"spec": {"replicatedJobs": [
        {"name": "w", "template": both["spec"]["jobTemplate"]}]}}
    neither = make_tj()
    del neither["spec"]["jobTemplate"]
    cases = [("as made", make_tj()), ("Adaptive, no target", no_target),
             ("Fixed, no target", fixed), ("job-wide", job_wide()),
             ("job-wide, enforcement defaulted", defaulted_quota),
             ("job-wide, Cooperative", job_wide(enforcement="Cooperative")),
             ("job-wide, GPU too", job_wide(targets={"cpu": {"peak": "1"},
                                                     "gpu": {"peakPowerWatts": 200}})),
             ("job-wide, GPU only", job_wide(targets={"gpu": {"peakPowerWatts": 200}})),
             ("both templates", both), ("no template", neither)]
    for _, obj in cases:
        obj["metadata"]["namespace"] = "default"
    return cases


@pytest.mark.parametrize(("case", "obj"), rule_cases(), ids=[c for c, _ in rule_cases()])
def test_the_api_server_and_the_operator_refuse_the_same_specs_for_each_rule(
        kubectl: Kubectl, crd_installed: None, case: str, obj: dict[str, Any]) -> None:
    """The CRD's CEL and the operator's Python are one table (spec_rules.py): here the
    real API server and the Python side judge each spec alike, with the same words."""
    spec = obj["spec"]
    why = broken_spec(spec) or broken_throttle(spec["throttle"])
    ok, err = dry_run_create(kubectl, obj)
    assert ok == (why is None), (case, why, err)
    assert why is None or why in err, (case, err)
