"""Alert rules: promtool checks them, unit tests each alert, the chart embeds them as is."""

from __future__ import annotations

import re
import subprocess

import yaml

from testing.chart import ALL_ON, by_kind, render
from testing.helpers import require_tool
from testing.paths import CHART, ROOT

RULES = CHART / "rules" / "throttledjob.rules.yaml"
UNIT_TESTS = ROOT / "tests" / "chart" / "alerts_test.yaml"
EXPECTED = {"ThrottledJobTargetMissed", "ThrottledJobSlowdownBudgetExhausted",
            "ThrottledJobSidecarDown", "ThrottledJobControlLoopStalled",
            "ThrottledJobSidecarRestarting",
            "ThrottledJobTelemetryMissing", "ThrottledJobGPUThermalThrottled",
            "ThrottledJobGPUPowerThrottled"}


def alerts() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
            if "alert" in r]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_tool("promtool"), *args], capture_output=True, text=True,
                          timeout=120)


def test_promtool_check_rules() -> None:
    proc = promtool("check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in proc.stdout


def test_promtool_unit_tests_pass() -> None:
    proc = promtool("test", "rules", str(UNIT_TESTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_has_a_unit_test_that_fires_it_and_one_that_does_not() -> None:
    assert {a["alert"] for a in alerts()} == EXPECTED
    fired, silent = set(), set()
    for case in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else silent).add(check["alertname"])
    assert fired == EXPECTED and silent == EXPECTED


def test_the_unit_tests_can_fail(tmp_path) -> None:
    """promtool test really compares: a rule with a longer `for` fails its unit test."""
    broken = RULES.read_text().replace("for: 15m", "for: 30m")
    rules = tmp_path / "rules.yaml"
    rules.write_text(broken)
    tests = UNIT_TESTS.read_text().replace(
        "../../charts/throttledjob/rules/throttledjob.rules.yaml", str(rules))
    (tmp_path / "t.yaml").write_text(tests)
    proc = promtool("test", "rules", str(tmp_path / "t.yaml"))
    assert proc.returncode != 0 and "ThrottledJobTargetMissed" in proc.stdout + proc.stderr


def test_alerts_are_documented_and_annotated() -> None:
    docs = (ROOT / "docs" / "metrics.md").read_text()
    for a in alerts():
        assert a["alert"] in docs, f"{a['alert']} missing from docs/metrics.md"
        assert a["labels"]["severity"] in ("warning", "critical")
        assert a["annotations"]["summary"] and a["annotations"]["description"]
        assert re.fullmatch(r"\d+m", a["for"])
        # Metric names in expressions are ones the sidecar documents (or Prometheus's up).
        for name in re.findall(r"\b(throttledjob_[a-z_]+)", a["expr"]):
            assert name in docs, name


def test_prometheus_rule_embeds_the_rules_file(tmp_path) -> None:
    (rule,) = by_kind(render(ALL_ON, tmp_path), "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
