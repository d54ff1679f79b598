"""Fixtures and hooks for the whole suite. Tests run against the installed package (`make
install`); what they share beyond fixtures is the `testing` package at the root."""

from __future__ import annotations

from pathlib import Path

import pytest

from testing.paths import ROOT, VENV_BIN


@pytest.fixture
def throttledjob_cmd() -> list[str]:
    """The installed console script, as a user runs it."""
    return [str(VENV_BIN / "throttledjob")]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/cluster/ needs the Kubernetes cluster the suite builds
    (marker `cluster`): `make fast` leaves them out."""
    cluster_dir = ROOT / "tests" / "cluster"
    for item in items:
        if cluster_dir in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.cluster)
