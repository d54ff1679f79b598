"""The chart's README (tools/chart_readme.py): generated from values.yaml and current with
it, one row for every value, and the `# --` parser checked on a values text of its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from testing.paths import CHART
from tools import chart_readme as generator
from tools.chart_readme import Row

VALUES = CHART / "values.yaml"


def test_readme_is_generated_from_values_yaml() -> None:
    assert (CHART / "README.md").read_text() == generator.render(), "run make chart-readme"
    assert generator.main(["--check"]) == 0


def _leaves(value: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    # A map's keys are the keys users set; a list or an empty map is set whole.
    if isinstance(value, dict) and value:
        return [leaf for k, v in value.items() for leaf in _leaves(v, (*path, str(k)))]
    return [path]


def test_every_value_has_a_row_with_its_default() -> None:
    values = yaml.safe_load(VALUES.read_text())
    rows = generator.rows(VALUES.read_text())
    # No key of this chart holds a dot, so a row's key splits back into its path.
    by_path = {tuple(r.key.split(".")): r for r in rows}
    assert len(by_path) == len(rows), "a key has two rows"
    for leaf in _leaves(values):
        covering = [p for p in by_path if leaf[:len(p)] == p]
        assert len(covering) == 1, f"{'.'.join(leaf)}: rows {covering}"
    for path, row in by_path.items():
        value = values
        for k in path:
            value = value[k]
        assert row.default == f"`{json.dumps(value, separators=(',', ':'))}`", row.key


SAMPLE = """\
# Values of an example chart: a header, not a description.

# -- The image.
image:
  # -- Not part of the next description: only the last group from `# --` counts.
  # -- Repository and name, a description that goes
  # on over two lines | with a pipe.
  repository: example/app
  tag: ""
# -- Labels, one row whole: its keys have no comments.
labels: {team: ml, tier: batch}
ports:
  - 80
  - 443
# -- Requests and limits.
resources:
  limits:
    memory: 1Gi
    cpu: 0.5
tuning:
  # -- Whether to tune.
  enabled: true
  # -- How often.
  # @default -- every minute
  every: 60
  since: 2024-01-01T10:00:00Z
  "a.b": null
"""


def test_rows_of_a_values_text() -> None:
    assert generator.rows(SAMPLE) == [
        Row("image.repository", "string", '`"example/app"`',
            "Repository and name, a description that goes on over two lines | with a pipe."),
        Row("image.tag", "string", '`""`', ""),
        Row("labels", "object", '`{"team":"ml","tier":"batch"}`',
            "Labels, one row whole: its keys have no comments."),
        Row("ports", "list", "`[80,443]`", ""),
        Row("resources", "object", '`{"limits":{"memory":"1Gi","cpu":0.5}}`',
            "Requests and limits."),
        Row("tuning.enabled", "bool", "`true`", "Whether to tune."),
        Row("tuning.every", "int", "every minute", "How often."),
        # Helm reads values through JSON: a date stays a string.
        Row("tuning.since", "string", '`"2024-01-01T10:00:00Z"`', ""),
        Row('tuning."a.b"', "string", "`nil`", ""),
    ]
    # With no `# --` anywhere, each top-level key is still a row of its own.
    assert generator.rows("a: 1\nb: {c: [2]}\n") == [
        Row("a", "int", "`1`", ""), Row("b", "object", '`{"c":[2]}`', "")]
    assert generator.table(generator.rows(SAMPLE)).splitlines()[2] == (
        '| image.repository | string | `"example/app"` | Repository and name, a description '
        "that goes on over two lines \\| with a pipe. |")


def test_check_fails_on_a_stale_readme(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    readme = tmp_path / "charts" / "throttledjob" / "README.md"
    readme.parent.mkdir(parents=True)
    readme.write_text(generator.render().replace("| bool |", "| string |", 1))
    monkeypatch.setattr(generator, "ROOT", tmp_path)
    monkeypatch.setattr(generator, "OUTPUT", readme)
    assert generator.main(["--check"]) == 1
    assert capsys.readouterr().err == (
        "charts/throttledjob/README.md is out of date: run make chart-readme\n")
    assert generator.main([]) == 0
    assert generator.main(["--check"]) == 0
