"""Fixtures for the operator: the kmock emulator (testing/emulator.py) and a real operator
process pointed at it (testing/operator_process.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testing.emulator import Emulator
from testing.operator_process import OperatorProcess


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    emu = Emulator().start()
    yield emu
    emu.stop()


@pytest.fixture
def operator_process(emulator: Emulator, tmp_path: Path,
                     request: pytest.FixtureRequest) -> Iterator[OperatorProcess]:
    op = OperatorProcess(emulator.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path)
    yield op
    op.stop()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        sys.stderr.write(f"--- operator log ---\n{op.log_text()}\n")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    report = yield
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report
