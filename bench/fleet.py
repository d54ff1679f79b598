"""A fleet CPU budget (ThrottleBudget), against the split a platform team makes by hand.

Scale (`--members 200`, no cluster): the operator's work for one re-split of a budget over
N members, each with a full demand history: the split (fleet_split.split) and the status
built from it, median of 20 (the API writes after it are one status patch, and a pass
for each member whose share moved).

Cost (`--pairs N`, the real node of the one-machine cluster): three ThrottledJobs of fixed
work that differ in what throttling costs them (one saturating two cores, one on one core,
one bursting two cores for a second then asleep four), run together two ways, the order
alternating:
- even: each held Hard to a third of the budget (its own target), no ThrottleBudget;
- budget: the same jobs under one ThrottleBudget of that total, split by cost.
Figures: each job's wall time (the ThrottledJob's start to completion) and its slowdown
(over the same job run alone, unthrottled, first), the sum of the slowdowns (what the split
minimises) and the last to finish, and the p99 of the three containers' summed CPU by the
kernel's own accounting, from when the split is in force.

    .venv/bin/python -m bench.fleet --members 200
    .venv/bin/python -m bench.fleet --pairs 2      # uses `make cluster`'s, else its own
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.harness import a_cluster, markdown
from testing.cluster_cli import Kubectl, helm, wait_json
from testing.node_samples import CgroupSampler, on_real_node, summed
from testing.paths import CHART, ROOT
from throttledjob.operator import api_names
from throttledjob.operator.budget_crd import BUDGET_KIND
from throttledjob.operator.budget_pass import Weighed, next_status
from throttledjob.operator.fleet import CPU, HISTORY, Fleet
from throttledjob.operator.fleet_split import Member, split
from throttledjob.sidecar.stats import nearest_rank
from tools.k8s import images

BUDGET = 1.2  # cores for the three jobs together
JOB_NAME = "batch.kubernetes.io/job-name"
SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
# Fixed work: loop iterations (about 3 s of one core each 10**8 here).
JOBS = {
    "saturating": ("two", 2 * 10**8, 0),  # two processes, no sleep
    "single": ("one", 2 * 10**8, 0),
    "bursty": ("two", 6 * 10**6, 8),  # 8 bursts, each then 4 s asleep
}
RUN_TIMEOUT = 900.0


def scale(members: int) -> dict[str, Any]:
    rng = random.Random(1)
    ms = [Member(f"m{i}", tuple(rng.uniform(0, 4) for _ in range(HISTORY)), 0.1,
                 rng.choice([None, 2.0, 4.0]), rng.choice([1.25, 1.5, 2.0]), rng.randint(0, 3))
          for i in range(members)]
    budget = 0.6 * sum(max(m.demand) for m in ms) / 2
    times = []
    for _ in range(20):
        start = time.perf_counter()
        out = split(budget, ms)
        next_status({"metadata": {"name": "b", "generation": 1}},
                    [Weighed(CPU, budget, ms, out)], "spec", Fleet(), "ns", "now")
        times.append(time.perf_counter() - start)
    return {"members": members, "split_seconds_median": round(statistics.median(times), 4),
            "split_seconds_max": round(max(times), 4), "goal_seconds": 1.0}


def work(kind: str, iterations: int, bursts: int) -> list[str]:
    one = (f"for _ in range({iterations}): pass" if not bursts else
           f"import time\nfor _ in range({bursts}):\n"
           f"    for _ in range({iterations}): pass\n    time.sleep(4)\n")
    run = f"python -c '{one}'"
    return ["sh", "-c", run if kind == "one" else
            f"{run} & a=$!; {run} & b=$!; wait $a && wait $b"]


def job(name: str, namespace: str, arm: str, command: list[str]) -> dict[str, Any]:
    container = {"name": "work", "image": images.PRODUCT_IMAGE, "imagePullPolicy": "Never",
                 "command": command,
                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                 "securityContext": SECURITY}
    # 2 cores: the whole machine, unthrottled (alone), or not binding (under the budget).
    own = {"cpu": {"peak": f"{int(BUDGET / 3 * 1000)}m"}, "hold": "Hard"} if arm == "even" \
        else {"cpu": {"peak": "2"}}
    return {"apiVersion": api_names.API_VERSION, "kind": api_names.KIND,
            "metadata": {"name": name, "namespace": namespace, "labels": {"fleet": arm}},
            "spec": {"jobTemplate": {"spec": {"backoffLimit": 0, "template": {
                         "spec": on_real_node({"containers": [container]})}}},
                     "throttle": {"targets": own}}}


def seconds(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def one_set(node: Any, kubectl: Kubectl, namespace: str, arm: str, i: int,
            kinds: tuple[str, ...] = tuple(JOBS)) -> dict[str, Any]:
    """The jobs of `kinds` run together under `arm`: even (each a third of the budget),
    budget (one ThrottleBudget) or alone (unthrottled: the slowdowns' baseline)."""
    names = {kind: f"{arm}-{i}-{kind}" for kind in kinds}
    if arm == "budget":
        kubectl.apply({"apiVersion": api_names.API_VERSION, "kind": BUDGET_KIND,
                       "metadata": {"name": f"fleet-{i}", "namespace": namespace},
                       "spec": {"selector": {"matchLabels": {"fleet": arm}},
                                "cpu": {"peak": f"{int(BUDGET * 1000)}m"}}})
    kubectl.apply(*[job(names[k], namespace, arm, work(*JOBS[k])) for k in kinds])
    samplers = [CgroupSampler(node, kubectl, namespace, f"{JOB_NAME}={n}", "work")
                for n in names.values()]
    try:
        done = {}
        for kind, name in names.items():
            done[kind] = wait_json(kubectl, lambda t: (t.get("status") or {}).get("phase")
                                   in ("Succeeded", "Failed"), "tj", "-n", namespace, name,
                                   what=f"{name} to finish", timeout=RUN_TIMEOUT)
    finally:
        for s in samplers:
            s.stop()
    starts = {k: seconds(t["status"]["startTime"]) for k, t in done.items()}
    ends = {k: seconds(t["status"]["completionTime"]) for k, t in done.items()}
    walls = {k: ends[k] - starts[k] for k in kinds}
    # Judged from when the split is in force: 15 s after the start (its reads).
    base = max(samplers, key=lambda s: len(s.cores))
    held = [c for t, c in zip(base.times, summed(samplers), strict=True)
            if t >= min(starts.values()) + 15]
    kubectl("delete", "tj", "-n", namespace, "-l", f"fleet={arm}", "--wait=true")
    kubectl("delete", "throttlebudget", "-n", namespace, "--all", "--wait=true")
    return {"arm": arm, "walls": walls, "sum_s": round(sum(walls.values()), 1),
            "last_s": round(max(ends.values()) - min(starts.values()), 1),
            "p99_cores": round(nearest_rank(held, 0.99) or 0.0, 3),
            "phases": sorted({t["status"]["phase"] for t in done.values()})}


def cost(cluster: Any, pairs: int) -> list[dict[str, Any]]:
    from tools.k8s import node as node_mod

    kubectl = Kubectl(cluster.kubeconfig)
    node = node_mod.RealNode(cluster)
    if not (cluster.state.get("node") and node.ready()):
        node = cluster.add_real_node(600)
    release = f"fleet-{uuid.uuid4().hex[:6]}"
    system, watched = f"{release}-system", f"{release}-jobs"
    for ns in (system, watched):
        kubectl("create", "namespace", ns)
    values = Path(tempfile.mkdtemp()) / "values.yaml"
    values.write_text(json.dumps({"watchNamespaces": [watched],
                                  "operator": {"statusIntervalSeconds": 2}}))
    runs = []
    try:
        helm(cluster, "install", release, str(CHART), "-n", system, "-f",
             str(ROOT / "examples/one-machine/values.yaml"), "-f", str(values), "--wait",
             "--timeout", "180s")
        alone = {k: one_set(node, kubectl, watched, "alone", 0, (k,))["walls"][k]
                 for k in JOBS}
        print(json.dumps({"alone": alone}), flush=True)
        for i in range(pairs):
            for arm in (("even", "budget") if i % 2 == 0 else ("budget", "even")):
                run = one_set(node, kubectl, watched, arm, i)
                run["slowdowns"] = {k: round(run["walls"][k] / alone[k], 2) for k in JOBS}
                run["sum_slowdowns"] = round(sum(run["slowdowns"].values()), 2)
                runs.append(run)
                print(json.dumps(run), flush=True)
    finally:
        with contextlib.suppress(Exception):
            helm(cluster, "uninstall", release, "-n", system, "--wait", "--timeout", "60s")
        for ns in (system, watched):
            kubectl("delete", "namespace", ns, "--wait=false", check=False)
    return runs


def cost_table(runs: list[dict[str, Any]]) -> str:
    rows = [{"arm": r["arm"], **{f"{k}_s": round(v, 1) for k, v in r["walls"].items()},
             "sum_slowdowns": r["sum_slowdowns"], "last_s": r["last_s"],
             "p99_cores": r["p99_cores"]} for r in runs]
    even = [r for r in runs if r["arm"] == "even"]
    ours = [r for r in runs if r["arm"] == "budget"]
    def ratio(key: str) -> float:
        return statistics.median(b[key] / e[key] for b, e in zip(ours, even, strict=True))

    ratios = "; ".join(f"{key}: budget/even median {ratio(key):.3f}"
                       for key in ("sum_slowdowns", "last_s"))
    return markdown(rows) + f"\n\n{ratios} (budget {BUDGET} cores)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=0, help="scale: members of a budget")
    parser.add_argument("--pairs", type=int, default=0, help="cost: pairs of sets")
    args = parser.parse_args()
    if args.members:
        out = scale(args.members)
        print(markdown([{"figure": k, "value": v} for k, v in out.items()]))
    if args.pairs:
        with a_cluster() as cluster:
            print(cost_table(cost(cluster, args.pairs)))


if __name__ == "__main__":
    main()
