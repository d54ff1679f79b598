"""The ThrottledJob examples of examples/ and the state each one's `# expect:` line
claims, for the suite that applies them (tests/cluster/test_examples_live.py) and the one
that holds the docs to them (tests/test_examples.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testing.paths import ROOT

EXPECT = re.compile(r"^# expect: (.*)$", re.M)
BOUND = re.compile(r"^(\w+)([<>])([0-9.]+)$")  # slowdown>1.2: a figure of status.observed


@dataclass(frozen=True)
class Example:
    path: Path
    manifest: dict[str, Any]
    phase: str  # the ThrottledJob's phase at its end
    conditions: dict[str, tuple[str, str | None]]  # type -> (status, reason or None)
    # status.observed figures: (key, ">" or "<", bound)
    bounds: tuple[tuple[str, str, float], ...] = ()


def claimed(path: Path) -> Example:
    """An example and its claim: `# expect: phase=Succeeded TargetMet=False/BudgetExhausted
    slowdown<1.7` (a condition's status/reason; a bound on a figure of status.observed)."""
    text = path.read_text()
    (line,) = EXPECT.findall(text)
    parts = line.split()
    bounds = tuple((m[1], m[2], float(m[3])) for m in map(BOUND.match, parts) if m)
    fields = dict(p.split("=", 1) for p in parts if not BOUND.match(p))
    conditions = {}
    for type_, value in fields.items():
        if type_ != "phase":
            status, _, reason = value.partition("/")
            conditions[type_] = (status, reason or None)
    return Example(path, yaml.safe_load(text), fields["phase"], conditions, bounds)


def examples() -> list[Example]:
    """Every example ThrottledJob of examples/ that makes a claim (all at its top)."""
    return [claimed(p) for p in sorted((ROOT / "examples").glob("*.yaml"))
            if EXPECT.search(p.read_text())]


def documented_manifests(text: str) -> list[dict[str, Any]]:
    """The whole ThrottledJobs (apiVersion, kind, metadata, spec) in a page's yaml blocks;
    fragments of a spec are not manifests."""
    out = []
    for block in re.findall(r"```ya?ml\n(.*?)```", text, re.S):
        for doc in yaml.safe_load_all(block):
            if isinstance(doc, dict) and doc.get("kind") == "ThrottledJob" \
                    and {"apiVersion", "metadata", "spec"} <= doc.keys():
                out.append(doc)
    return out
