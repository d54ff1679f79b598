"""bench/operator_load.py and bench/attach_overhead.py at a tiny size on the session's
cluster (a second cluster beside it would break a 2-core machine): each must measure
every figure and print its table. The figures are never judged here
(docs/dev/benchmarks.md has the real runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import attach_overhead, operator_load
from testing.benchmarks import table_rows

pytestmark = pytest.mark.bench


def test_operator_load(cluster: Any) -> None:
    # The poller at 2 s, where the benchmark's 10 s made the run wait 20 s for it and up
    # to 100 s for every status to step (the run took 193 s cold in CI).
    figures = operator_load.run(cluster, n=3, rate=1.0, steady_seconds=2.0,
                                status_interval=2.0, settle_seconds=2.0)
    rows = table_rows(operator_load.table(figures), "| figure | value |")
    assert [row[0] for row in rows] == list(figures)
    assert figures["throttledjobs"] == 3


def test_attach_overhead(cluster: Any, tmp_path: Path) -> None:
    """bench/attach_overhead.py at a tiny size: both sides measured, every pod of the
    webhook's side throttled and none of the baseline's (a bench comparing a webhook that
    did nothing would measure nothing)."""
    figures = attach_overhead.run(cluster, pods=3, pairs=1, tmp=tmp_path)
    rows = table_rows(attach_overhead.table(figures), "| figure | value |")
    assert [row[0] for row in rows] == list(figures)
    assert figures["webhook_pods_throttled"] == 3 and figures["baseline_pods_throttled"] == 0
    assert figures["ratio_all_seconds"] is not None
