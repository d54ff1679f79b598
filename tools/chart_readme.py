"""Generate the chart's README from Chart.yaml and values.yaml, as helm-docs does.

    python -m tools.chart_readme            # write charts/throttledjob/README.md
    python -m tools.chart_readme --check    # exit 1 if the README differs from what this writes

The README is the chart's name, version and description from Chart.yaml, the intro
below, and a table of every value: one row per leaf of values.yaml, in file order, its
description the `# --` comment above the key (helm-docs' convention: the comment may go
on over the next `#` lines; `# @default -- TEXT` replaces the Default cell). A map or list
none of whose keys has a `# --` comment of its own is one row, its default the whole
value. tests/chart/test_chart_readme.py fails when the README is stale.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "throttledjob"
OUTPUT = CHART / "README.md"

INTRO = """\
## What it installs

- The `ThrottledJob` and `ThrottleBudget` CRDs (from `crds/`: Helm installs them on the
  first install and never upgrades them; [docs/install.md](../../docs/install.md) says
  how to upgrade them).
- The operator: one Deployment, its ServiceAccount and RBAC with only the verbs it
  uses (a ClusterRole, or with `watchNamespaces` a Role in each namespace listed).
- Admission policies (`admission.enabled`, on by default): the API server refuses a
  ThrottledJob unless its author may create Jobs in its namespace.
- Off by default: a PodMonitor and a PrometheusRule with the alerts (`monitoring.*`), a
  ConfigMap holding the Grafana dashboard for the Grafana sidecar, NetworkPolicies that
  keep the sidecars' metrics port to Prometheus and the operator (`networkPolicy.*`), and
  the GPU node agent, a DaemonSet and its CSIDriver (`gpu.nodeAgent.*`).

## Install

```console
$ helm install throttledjob charts/throttledjob -n throttledjob-system --create-namespace
```

With kube-prometheus-stack, whose Prometheus selects PodMonitors and PrometheusRules by
the label `release` (the name of its own Helm release), switch the monitoring on
(`--set monitoring.podMonitor.enabled=true --set monitoring.prometheusRule.enabled=true`)
and give both objects that label:

```
--set monitoring.podMonitor.labels.release=<your release>
--set monitoring.prometheusRule.labels.release=<your release>
```

The PodMonitor and the PrometheusRule are kinds of the Prometheus Operator
(`monitoring.coreos.com/v1`): on a cluster without its CRDs, an install with
`monitoring.podMonitor.enabled` or `monitoring.prometheusRule.enabled` true fails before
anything is created, with a message that names the value to set `false` (the default).

`values.schema.json` refuses an unknown key or a wrong type before anything reaches the
cluster. More, and which feature needs which Kubernetes version:
[docs/install.md](../../docs/install.md).
"""

# helm-docs' patterns: a description starts at the last `# --` line above its key, and
# `# @default -- TEXT` overrides the rendered default.
_START = re.compile(r"\s*# --(?:\s+(.*))?")
_DEFAULT = re.compile(r"\s*# @default --(?:\s+(.*))?")
_CONTINUATION = re.compile(r"\s*#\s?(.*)")


class _Loader(yaml.SafeLoader):
    """Helm reads values.yaml through JSON, where a date-like scalar stays a string."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


@dataclass(frozen=True)
class Row:
    key: str
    type: str
    default: str
    description: str


@dataclass(frozen=True)
class _Doc:
    description: str
    default: str | None


def _doc(lines: list[str], key: yaml.Node) -> _Doc | None:
    """The `# --` comment in the run of comment lines right above `key`."""
    key_line = key.start_mark.line
    # A key of a flow map ({a: 1}) or one after another on its line has no comment of its
    # own: the lines above belong to the key that starts the line.
    if lines[key_line][:key.start_mark.column].strip(" -"):
        return None
    top = key_line
    while top > 0 and lines[top - 1].lstrip().startswith("#"):
        top -= 1
    block = lines[top:key_line]
    # As helm-docs: only the last group starting with `# --` counts, so a section comment
    # above a described key stays out of its description.
    starts = [i for i, line in enumerate(block) if _START.fullmatch(line)]
    if not starts:
        return None
    start = _START.fullmatch(block[starts[-1]])
    assert start is not None
    parts = [start.group(1) or ""]
    default = None
    for line in block[starts[-1] + 1:]:
        if m := _DEFAULT.fullmatch(line):
            default = (m.group(1) or "").strip()
        elif m := _CONTINUATION.fullmatch(line):
            parts.append(m.group(1))
    text = " ".join(p.strip() for p in parts if p.strip())
    return _Doc(text, default)


def _key(prefix: str, name: str) -> str:
    # helm-docs quotes a key that would read as a path of its own.
    if "." in name or " " in name:
        name = f'"{name}"'
    return f"{prefix}.{name}" if prefix else name


def _type(value: Any) -> str:
    if isinstance(value, bool):  # before int: bool is an int in Python
        return "bool"
    for kind, name in ((int, "int"), (float, "float"), (list, "list"), (dict, "object")):
        if isinstance(value, kind):
            return name
    return "string"


def _json(value: Any) -> str:
    if value is None:
        return "`nil`"  # helm-docs' rendering of a null
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    # A backtick inside would end a single-backtick code span early.
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _cell(text: str) -> str:
    # A bare `|` ends a cell in a GFM table, inside a code span too.
    return text.replace("|", "\\|")


def rows(text: str) -> list[Row]:
    """The Values table of a values.yaml text, in file order."""
    lines = text.splitlines()
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return []

        def value(node: yaml.Node) -> Any:
            return loader.construct_object(node, deep=True)

        def documented(node: yaml.Node) -> bool:
            """Whether any key under `node` has a `# --` comment of its own."""
            if isinstance(node, yaml.MappingNode):
                return any(_doc(lines, k) or documented(v)
                           for k, v in node.value)
            if isinstance(node, yaml.SequenceNode):
                return any(documented(item) for item in node.value)
            return False

        def keys(node: yaml.MappingNode, prefix: str) -> list[Row]:
            return [row for k, v in node.value
                    for row in walk(v, _key(prefix, str(value(k))), _doc(lines, k))]

        def walk(node: yaml.Node, prefix: str, doc: _Doc | None) -> list[Row]:
            # A map or list goes on into rows of its own keys only where those carry
            # comments; otherwise it is one row, and an empty one always is.
            if isinstance(node, yaml.MappingNode) and documented(node):
                return keys(node, prefix)
            if isinstance(node, yaml.SequenceNode) and documented(node):
                return [row for i, item in enumerate(node.value)
                        for row in walk(item, f"{prefix}[{i}]", None)]
            v = value(node)
            default = doc.default if doc and doc.default is not None else _json(v)
            return [Row(prefix, _type(v), default, doc.description if doc else "")]

        if not isinstance(root, yaml.MappingNode):
            raise ValueError("values.yaml must be a map at its top")
        return keys(root, "")
    finally:
        loader.dispose()


def table(values: list[Row]) -> str:
    out = ["| Key | Type | Default | Description |", "|-----|------|---------|-------------|"]
    out += [f"| {_cell(r.key)} | {r.type} | {_cell(r.default)} | {_cell(r.description)} |"
            for r in values]
    return "\n".join(out) + "\n"


def render(chart_dir: Path = CHART) -> str:
    chart = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    values = rows((chart_dir / "values.yaml").read_text())
    description = " ".join(str(chart.get("description", "")).split())
    head = (
        f"# {chart['name']}\n\n"
        "<!-- Generated by tools/chart_readme.py from Chart.yaml, values.yaml and the intro "
        "in the script: edit those, then run make chart-readme. -->\n\n"
        f"**Version:** {chart['version']} · **AppVersion:** {chart.get('appVersion', '')}"
        f" · **Kubernetes:** `{chart.get('kubeVersion', 'any')}`\n\n"
        f"{description}\n\n"
    )
    values_intro = (
        "## Values\n\n"
        "Each value's description is its `# --` comment in values.yaml.\n\n"
    )
    return head + INTRO + "\n" + values_intro + table(values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="fail if the README differs from what this would write")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT.relative_to(ROOT)} is out of date: run make chart-readme",
                  file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
