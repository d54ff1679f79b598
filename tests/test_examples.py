"""The docs show only what the suite runs: every whole ThrottledJob in the README and the
user's pages is one of examples/, each of which tests/cluster/test_examples_live.py
applies on the real node and holds to its `# expect:` claim."""

from __future__ import annotations

import pytest
import yaml

from testing.examples import claimed, documented_manifests, examples
from testing.paths import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
README_MAX_LINES = 200


def every_example_manifest() -> list[dict]:
    return [doc for p in sorted((ROOT / "examples").rglob("*.yaml"))
            for doc in yaml.safe_load_all(p.read_text()) if isinstance(doc, dict)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_whole_throttledjob_in_the_docs_is_an_example_the_suite_runs(page) -> None:
    known = every_example_manifest()
    for manifest in documented_manifests(page.read_text()):
        assert manifest in known, (f"{page.relative_to(ROOT)}: ThrottledJob "
                                   f"{manifest['metadata'].get('name')!r} is in no file of "
                                   "examples/: show a fragment, or make it an example")


def test_the_readme_shows_the_hello_example_and_stays_short() -> None:
    text = (ROOT / "README.md").read_text()
    hello = claimed(ROOT / "examples" / "hello.yaml").manifest
    assert hello in documented_manifests(text)
    assert len(text.splitlines()) < README_MAX_LINES


def test_the_claims_are_read_as_written(tmp_path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("# expect: phase=Succeeded TargetMet=False/BudgetExhausted slowdown<1.7\n"
                    "kind: ThrottledJob\n")
    example = claimed(path)
    assert example.phase == "Succeeded"
    assert example.conditions == {"TargetMet": ("False", "BudgetExhausted")}
    assert example.bounds == (("slowdown", "<", 1.7),)
    names = {e.path.name for e in examples()}
    assert {"hello.yaml", "budget.yaml", "hard-target.yaml"} <= names
