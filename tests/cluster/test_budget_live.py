"""A ThrottleBudget on the real node: one CPU peak held across two ThrottledJobs, judged
by the kernel's own accounting (each workload container sampled every second from the
node, the two summed second by second), as the fleet's promise reads: the sum held under
the budget, a drop of the budget (a grid signal patched in) followed within a bound, and
a member that ends re-split to the other.

The two members differ in what throttling costs them: one saturates two cores, one
bursts two cores for a second in five. Their figures against an even split are
bench/fleet.py's; here the behaviour, once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testing import chart, dashboard, promserver, scrape
from testing.cluster_cli import Kubectl, wait_json
from testing.helpers import wait_for
from testing.node_samples import CgroupSampler, on_real_node, summed
from throttledjob.contracts.policy import parse_cpu_quantity
from throttledjob.operator import api_names
from throttledjob.operator.budget_crd import BUDGET_KIND
from throttledjob.sidecar.stats import nearest_rank
from throttledjob.sidecar.summary import cpu_peak_bound
from tools.k8s import cluster as k8s
from tools.k8s import images

pytestmark = pytest.mark.timeout(300)

BUDGET = 1.0  # cores, the two members together
DROP = 0.6  # the signal's fraction: 0.6 core
# The pass that follows a patched budget runs on its watch event; its members' pods are
# resized at once: the kubelet applies a resize within a second or two here. The bound
# stated in docs/benchmarks.md is the status interval (the schedule's moves wait for the
# next tick) plus this.
DROP_SECONDS = 10.0
JOB_NAME = "batch.kubernetes.io/job-name"
SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def busy(seconds: int, on: float, off: float) -> list[str]:
    """Two processes, each busy `on` seconds then asleep `off`, for `seconds` in all."""
    loop = (f"import time\nend = time.time() + {seconds}\n"
            "while time.time() < end:\n"
            f"    t = time.time() + {on}\n"
            "    while time.time() < t: pass\n"
            f"    time.sleep({off})\n")
    return ["sh", "-c", f"python -c '{loop}' & a=$!; python -c '{loop}' & b=$!; "
                        "wait $a && wait $b"]


def member(name: str, namespace: str, command: list[str]) -> dict[str, Any]:
    container = {"name": "work", "image": images.PRODUCT_IMAGE, "imagePullPolicy": "Never",
                 "command": command,
                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                 "securityContext": SECURITY}
    return {"apiVersion": api_names.API_VERSION, "kind": api_names.KIND,
            "metadata": {"name": name, "namespace": namespace, "labels": {"team": "a"}},
            "spec": {"jobTemplate": {"spec": {"backoffLimit": 0, "template": {
                         "spec": on_real_node({"containers": [container]})}}},
                     "throttle": {"targets": {"cpu": {"peak": "2"}}}}}


def limits(kubectl: Kubectl, namespace: str) -> dict[str, float]:
    """Each running member pod's workload limit as the kubelet applied it, by Job."""
    out = {}
    for pod in kubectl.json("get", "pods", "-n", namespace, "-l", "team=a")["items"]:
        if (pod.get("status") or {}).get("phase") != "Running":
            continue
        for c in pod["status"].get("containerStatuses") or []:
            cpu = ((c.get("resources") or {}).get("limits") or {}).get("cpu")
            if c["name"] == "work" and cpu:
                out[pod["metadata"]["labels"][JOB_NAME]] = parse_cpu_quantity(cpu, "limit")
    return out


def window(samplers: list[CgroupSampler], start: float, end: float) -> list[float]:
    """The summed per-second samples taken between `start` and `end` (Unix time)."""
    base = max(samplers, key=lambda s: len(s.cores))
    return [c for t, c in zip(base.times, summed(samplers), strict=True) if start <= t <= end]


@pytest.fixture
def prometheus(operator: str, real_node: Any, kubectl: Kubectl,
               tmp_path: Path) -> Iterator[str]:
    """A real Prometheus scraping the operator and the members' sidecars as the chart's
    PodMonitors have it; yields its URL."""
    system = operator.removesuffix("-jobs") + "-system"
    (monitor,) = [m for m in chart.by_kind(chart.render(chart.ALL_ON, tmp_path), "PodMonitor")
                  if m["metadata"]["name"].endswith("-operator")]
    token = scrape.identity(real_node.cluster, kubectl, [operator, system], tmp_path)
    jobs = [scrape.sidecars(real_node.cluster, operator, token),
            scrape.operator(real_node.cluster, system, token,
                            monitor["spec"]["podMetricsEndpoints"][0])]
    with promserver.prometheus(tmp_path, [], scrape_configs=jobs, scrape_interval="1s",
                               binary=str(k8s.bin_dir() / "prometheus")) as url:
        yield url


def fleet_row(prom: str, namespace: str) -> dict[str, list[dict[str, Any]]]:
    """Every query of the dashboard's fleet row, for budget "team-a", once each answers."""
    values = {"datasource": "prometheus", "namespace": namespace, "budget": "team-a",
              "throttledjob": ".+", "pod": ".+", "gpu": ".+"}
    dash = dashboard.load(dashboard.CHART_COPY)
    row = {where: dashboard.fill(expr, values) for where, expr in dashboard.queries(dash)
           if "throttledjob_operator_budget_" in expr}
    assert len(row) >= 4, row
    # The `budget` variable: label_values(SELECTOR, budget) lists the budgets of the
    # selector's series.
    (variable,) = [v for v in dash["templating"]["list"] if v["name"] == "budget"]
    selector = variable["query"]["query"].removeprefix("label_values(").rsplit(", ", 1)[0]
    row["variable budget"] = dashboard.fill(selector, values)
    found: dict[str, list[dict[str, Any]]] = {}

    def answered() -> bool:
        found.update({where: promserver.promql(prom, expr) for where, expr in row.items()})
        return all(found.values())

    wait_for(answered, 20, interval=1,
             what=f"data for the fleet row: {[w for w, f in found.items() if not f]}")
    return found


def test_a_budget_holds_two_members_follows_a_drop_and_re_splits_when_one_ends(
        operator: str, real_node: Any, kubectl: Kubectl, prometheus: str) -> None:
    namespace = operator
    budget = {"apiVersion": api_names.API_VERSION, "kind": BUDGET_KIND,
              "metadata": {"name": "team-a", "namespace": namespace},
              "spec": {"selector": {"matchLabels": {"team": "a"}}, "cpu": {"peak": 1}}}
    template = {"metadata": {"labels": {"team": "a"}}}
    saturating = member("saturating", namespace, busy(70, 1, 0))
    bursty = member("bursty", namespace, busy(40, 1, 4))
    for tj in (saturating, bursty):  # the pods carry the label the sampler selects
        tj["spec"]["jobTemplate"]["spec"]["template"]["metadata"] = template["metadata"]
    kubectl.apply(budget)
    wait_json(kubectl, lambda b: (b.get("status") or {}).get("observedGeneration") == 1,
              "throttlebudget", "-n", namespace, "team-a", what="the budget seen")
    kubectl.apply(saturating, bursty)
    samplers = [CgroupSampler(real_node, kubectl, namespace, f"{JOB_NAME}={name}", "work")
                for name in ("saturating", "bursty")]
    try:
        wait_for(lambda: len(limits(kubectl, namespace)) == 2
                 and sum(limits(kubectl, namespace).values()) <= BUDGET + 1e-9, 90,
                 interval=0.5, what="both members held within the budget")
        # Each Job was made with its share of the budget as split when it was made, not at
        # the member's own 2 cores. The two are applied one after the other, so the first
        # may be made alone (the whole budget: its pods are resized to their share when
        # the second arrives, the wait above) or both seen at once (half each); either
        # way the one made second starts at half.
        made = sorted(parse_cpu_quantity(
            kubectl.json("get", "job", "-n", namespace, name)["spec"]["template"]["spec"]
            ["containers"][0]["resources"]["limits"]["cpu"], "limit")
            for name in ("saturating", "bursty"))
        assert made[0] <= BUDGET / 2 + 1e-9 and made[1] <= BUDGET + 1e-9, made
        # Split by cost once each member's demand is measured (fleet_split.py).
        status = wait_json(kubectl, lambda b: [m.get("demandCores") is not None and m["read"]
                                               for m in (b.get("status") or {}).get("members")
                                               or []] == [True, True],
                           "throttlebudget", "-n", namespace, "team-a",
                           what="the split by measured demand", timeout=60)
        # Five reads more: a one-second demand read every 2 s samples the bursts (a
        # 5-second cycle, so the reads fall on every part of it).
        more = time.time() + 10
        # Meanwhile, the dashboard's fleet row as Grafana would draw it: the operator's
        # series of the budget joined to its members' sidecars by namespace (the
        # operator's PodMonitor keeps the budget's own) and ThrottledJob.
        row = fleet_row(prometheus, namespace)
        time.sleep(max(0.0, more - time.time()))
        status = kubectl.json("get", "throttlebudget", "-n", namespace, "team-a")
        held = time.time()
        time.sleep(8)
        dropped_at = time.time()
        kubectl("patch", "throttlebudget", "-n", namespace, "team-a", "--type=merge",
                "-p", f'{{"spec":{{"signal":{{"fraction":{DROP}}}}}}}')
        wait_for(lambda: sum(limits(kubectl, namespace).values()) <= BUDGET * DROP + 1e-9,
                 DROP_SECONDS, interval=0.25, what="the fleet under the dropped budget")
        reaction = time.time() - dropped_at
        wait_json(kubectl, lambda t: (t.get("status") or {}).get("phase") == "Succeeded",
                  "tj", "-n", namespace, "bursty", what="the bursty member to end",
                  timeout=120)
        wait_for(lambda: limits(kubectl, namespace).get("saturating", 0)
                 >= BUDGET * DROP - 1e-9, 20, interval=0.5,
                 what="the saturating member given the whole budget once alone")
        alone = time.time() + 1.0
        time.sleep(4)
    finally:
        for s in samplers:
            s.stop()
    before = window(samplers, held, dropped_at)
    after = window(samplers, dropped_at + DROP_SECONDS, alone + 4)
    described = (f"drop followed in {reaction:.1f} s; held {[round(c, 3) for c in before]}; "
                 f"after the drop {[round(c, 3) for c in after]}; split {status['status']}")
    print(described)
    # Two pods' quotas summed: their 100 ms periods are not aligned (test_distributed_live).
    assert len(before) >= 6 and nearest_rank(before, 0.99) <= cpu_peak_bound(BUDGET) + 0.05, \
        described
    assert after and nearest_rank(after, 0.99) <= cpu_peak_bound(BUDGET * DROP) + 0.05, \
        described
    shares = {m["name"]: m["shareCores"] for m in status["status"]["members"]}
    assert sum(shares.values()) <= BUDGET + 1e-9, described
    # Its share is real room: the saturating member uses it whole.
    used = window(samplers[:1], held, dropped_at)
    assert sorted(used)[len(used) // 2] >= 0.8 * shares["saturating"], (used, described)
    # Busy one second in five, the bursty member loses less to a lower share: an even
    # split would give each half.
    assert shares["bursty"] < shares["saturating"] - 0.1, described
    # The fleet row drew the budget and each of its members under it: the shares, and
    # their slowdowns through the join to their sidecars' series.
    drawn = {where: sorted({(r["metric"].get("budget"), r["metric"].get("throttledjob", ""))
                            for r in found}) for where, found in row.items()}
    both, total = [("team-a", "bursty"), ("team-a", "saturating")], [("team-a", "")]
    assert sorted(drawn.values()) == [total] * 3 + [both] * 3, drawn
    assert [w for w, d in drawn.items() if d == both and "slowdown" in w], drawn
    (budget_now,) = row["panel \"Budget vs members' CPU\" A"]
    assert float(budget_now["value"][1]) == BUDGET, row
    final = kubectl.json("get", "throttlebudget", "-n", namespace, "team-a")["status"]
    assert final["cpuBudgetCores"] == pytest.approx(BUDGET * DROP)
    assert final["budgetSource"] == "signal", final
