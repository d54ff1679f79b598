"""The Grafana dashboard, checked for real: a real Prometheus scrapes a real
`throttledjob run --metrics-port ... --gpu-backend fake` holding a real workload, and every
panel query, every annotation and every template variable, with the variables filled in as
Grafana fills them, returns data. No Grafana server is installable here (docs/dev/testing.md).

The fleet row draws the operator's series of a ThrottleBudget, which only an operator on a
cluster serves: tests/cluster/test_budget_live.py runs those queries against a real
Prometheus scraping the chart's operator and sidecars.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from testing import promserver
from testing.dashboard import CHART_COPY, SCRAPE_SECONDS, STANDALONE, fill, load, queries
from testing.helpers import wait_for
from testing.paths import HUNGRY, ROOT
from tools import dashboard as generator

# What the chart's PodMonitor relabelings put on every series of a sidecar.
POD_LABELS = {"namespace": "ml", "throttledjob": "train", "pod": "train-x7k2p"}
PER_GPU = (r"throttledjob_gpu_(utilization_ratio|memory_used_bytes|memory_total_bytes|"
           r"memory_used_ratio|power_watts|power_limit_watts|temperature_celsius|"
           r"sm_clock_hertz|clock_throttle_reason|info|process_memory_used_bytes)\b")
FLEET = re.compile(r"throttledjob_operator_budget_")
# --- static checks: one source, the chart's copy, the standalone copy ----------------------

def test_both_copies_are_generated_from_the_one_source() -> None:
    text = generator.render()
    assert CHART_COPY.read_text() == text, "run python tools/dashboard.py"
    assert STANDALONE.read_text() == text, "run python tools/dashboard.py"
    assert generator.main(["--check"]) == 0


def test_dashboard_shape() -> None:
    dash = load(CHART_COPY)
    assert dash["uid"] == "throttledjob-overview" and dash.get("id") is None
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names == ["datasource", "namespace", "throttledjob", "pod", "gpu", "budget"]
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in panels:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["fieldConfig"]["defaults"].get("unit"), f"{p['title']}: no unit"
        assert p.get("description"), p["title"]
        for t in p["targets"]:
            # Every series is narrowed to the selected ThrottledJobs and pods; a budget's
            # to the selected budgets, and its members' to the selected ThrottledJobs.
            names = re.findall(r"([a-z_:]+)\{", t["expr"])
            sidecar = [n for n in names if not FLEET.match(n)]
            wanted = ["$namespace"]
            if FLEET.search(t["expr"]):
                wanted.append("$budget")
            if sidecar or "budget_share" in t["expr"]:
                wanted.append("$throttledjob")
            if sidecar:
                wanted.append("$pod")
            for var in wanted:
                assert var in t["expr"], f"{p['title']}: {var} not used in {t['expr']}"
            # Grafana's rate window, never a fixed one that breaks at other scrape intervals.
            for window in re.findall(r"\[([^\]]+)\]", t["expr"]):
                assert window == "$__rate_interval", f"{p['title']}: [{window}]"
            # Series with a `gpu` label (docs/metrics.md, "GPUs") follow the gpu variable.
            if re.search(PER_GPU, t["expr"]):
                assert 'gpu=~"$gpu"' in t["expr"], f"{p['title']}: {t['expr']}"
    # Grid: nothing overlaps, nothing wider than 24 columns.
    cells = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps"
                cells.add((x, y))
    titles = {p["title"] for p in panels}
    assert {"CPU cores vs target", "GPU utilization vs target", "GPU power vs target",
            "GPU memory", "Throttle level", "Levers in use", "Throughput",
            "Slowdown vs budget", "CPU peak p99", "CPU peak max"} <= titles
    assert {p["type"] for p in panels if "peak" in p["title"]} == {"stat"}
    assert {"Budget vs members' CPU", "Members' shares",
            "Members' slowdown vs maxSlowdown"} <= titles


def test_every_metric_the_dashboard_names_is_documented() -> None:
    """A cheap drift check beside the real one below: names appear in docs/metrics.md."""
    docs = (ROOT / "docs" / "metrics.md").read_text()
    text = CHART_COPY.read_text()
    for name in sorted(set(re.findall(r"throttledjob_[a-z_]+", text))):
        short = name.removeprefix("throttledjob_")
        assert name in docs or f"_{short.split('_', 1)[-1]}" in docs, name


# --- for real --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scraped(tmp_path_factory) -> Any:
    """A cooperative 2-process workload held to 1.2 cores with 2 simulated GPUs under GPU
    targets, scraped every second with the PodMonitor's labels; yields Prometheus's URL."""
    workdir = tmp_path_factory.mktemp("dashboard")
    with promserver.throttled_run(
            ["--cpu-peak", "1.2", "--gpu-peak-util", "70", "--gpu-peak-power", "250",
             "--gpu-memory-fraction", "0.8", "--max-slowdown", "1.6", "--gpu-backend",
             "fake"],
            [*HUNGRY, "--workers", "2", "--units", "100000", "--cooperative"],
            env={"THROTTLEDJOB_FAKE_GPUS": "2", "THROTTLEDJOB_FAKE_GPU_TRACE": "plateau"},
    ) as run_url, promserver.prometheus(workdir, [run_url.removeprefix("http://")],
                                        labels=POD_LABELS, unlabelled=OTHER_JOB,
                                        scrape_interval=f"{SCRAPE_SECONDS}s") as prom:
        wait_for(lambda: promserver.promql(prom, 'up{job="throttledjob"} == 1'), timeout=30,
                 what="a successful scrape")
        yield prom


# The same sidecar scraped again by a scrape configuration that puts none of our labels on
# (another team's job, annotation scraping): no panel may show it.
OTHER_JOB = "other"
ALL = {v["name"]: v["allValue"] for v in load(CHART_COPY)["templating"]["list"]
       if v["type"] == "query"}
SELECTIONS = {
    "one of each": {"namespace": "ml", "throttledjob": "train", "pod": "train-x7k2p",
                    "gpu": "1"},
    "All": ALL,
}
# What a sidecar serves: all but the fleet row's queries.
SIDECAR_QUERIES = {where: expr for where, expr in queries(load(CHART_COPY))
                   if not FLEET.search(expr)}


@pytest.mark.parametrize("selection", list(SELECTIONS))
def test_every_panel_query_returns_data_from_a_real_sidecar(scraped, selection) -> None:
    values = {"datasource": "prometheus", "budget": ".+", **SELECTIONS[selection]}
    todo = dict(SIDECAR_QUERIES)
    assert len(todo) >= 30

    def remaining() -> dict[str, str]:
        for where, expr in list(todo.items()):
            found = promserver.promql(scraped, fill(expr, values))
            # "All" is every ThrottledJob, not every target (".*" matched series without
            # the label too: the other job's, and any `up` of the cluster).
            strays = [r["metric"] for r in found if r["metric"].get("job") == OTHER_JOB
                      or ("by (namespace, throttledjob" in expr
                          and "throttledjob" not in r["metric"])]
            assert not strays, f"{where}: series of other scrapes {strays}"
            if found:
                del todo[where]
        return todo

    try:
        wait_for(lambda: not remaining(), timeout=60, interval=1,
                 what=f"data for every query ({selection})")
    except pytest.fail.Exception:
        pytest.fail(f"no data after 60s ({selection}) for: {json.dumps(todo, indent=1)}")


def test_a_selection_that_matches_nothing_returns_nothing(scraped) -> None:
    """The variables really filter: another ThrottledJob's selection is empty."""
    values = {"datasource": "prometheus", "namespace": "ml", "throttledjob": "other",
              "pod": ".*", "gpu": ".*", "budget": ".*"}
    wait_for(lambda: promserver.promql(scraped, "throttledjob_build_info"), timeout=30,
             what="first series")
    for where, expr in SIDECAR_QUERIES.items():
        assert promserver.promql(scraped, fill(expr, values)) == [], where


def test_template_variables_list_the_real_values(scraped) -> None:
    """label_values(selector, label): the selector's series carry the label's value."""
    values = ALL
    expected = {**POD_LABELS, "gpu": {"0", "1"}}
    for var in load(CHART_COPY)["templating"]["list"]:
        if var["type"] != "query" or FLEET.search(var["query"]["query"]):
            continue
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"]["query"])
        assert m, var["query"]
        selector, label = fill(m.group(1), values), m.group(2)

        def found(selector: str = selector, label: str = label) -> set[str]:
            # As Grafana's label_values: the values of the series that have the label.
            return {r["metric"][label] for r in promserver.promql(scraped, selector)
                    if label in r["metric"]}

        want = expected[var["name"]]
        want = want if isinstance(want, set) else {want}
        wait_for(lambda found=found, want=want: found() == want, timeout=30,
                 what=f"variable {var['name']} = {want}")
