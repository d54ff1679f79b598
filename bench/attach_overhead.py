"""What attach mode's webhook costs a burst of pods, beside the baseline a user has: the
same Job of N pods (KWOK's node: nothing runs) made by the real Job controller in a
namespace the webhook sees, where a ThrottledJob attached by label claims every pod, and
in one it does not see, alternating on one cluster. Each time is one client's: the Job's
create sent, then each of its pods seen by that client's watch.

    .venv/bin/python -m bench.attach_overhead [--pods 100] [--pairs 3]

Uses the cluster `make cluster` left running, else starts its own (tools/k8s/). The
operator runs as the chart's ServiceAccount with the chart's RBAC for attach mode, its
webhook on loopback (testing/attach.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import a_cluster, markdown
from bench.operator_load import Watch, percentile, rounded
from testing.attach import attach_operator
from testing.cluster_cli import Kubectl, wait_json
from testing.manifests import tj_manifest
from testing.paths import ROOT
from throttledjob.operator.attach import THROTTLE_LABEL
from throttledjob.operator.children import LABEL_NAME

THROTTLEDJOB = "bench"
JOB_NAME = "batch.kubernetes.io/job-name"
BURST_TIMEOUT = 300.0


def burst_job(name: str, namespace: str, pods: int) -> dict[str, Any]:
    """A Job of `pods` pods at once that joins the ThrottledJob by label (where one of
    that name exists), its pods held by KWOK for ten minutes."""
    template = tj_manifest("x", namespace, run_for="600s")["spec"]["jobTemplate"]["spec"]
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {THROTTLE_LABEL: THROTTLEDJOB}},
            "spec": {**template, "parallelism": pods, "completions": pods}}


def burst(cluster: Any, kubectl: Kubectl, namespace: str, name: str,
          pods: int) -> dict[str, Any]:
    """Each pod's seconds from the Job's create to this client's watch seeing it; the
    Job then goes, with its pods."""
    watch = Watch(cluster, f"/api/v1/namespaces/{namespace}/pods",
                  lambda p: p["metadata"]["name"]
                  if (p["metadata"].get("labels") or {}).get(JOB_NAME) == name else None)
    watch.start()
    watch.ready.wait(30)
    try:
        sent = time.monotonic()
        cluster.request("POST", f"/apis/batch/v1/namespaces/{namespace}/jobs",
                        burst_job(name, namespace, pods))
        deadline = sent + BURST_TIMEOUT
        while len(watch.seen) < pods:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(watch.seen)} of {pods} pods of {name} seen")
            time.sleep(0.05)
        latencies = sorted(t - sent for t in watch.seen.values())
    finally:
        watch.stop()
    made = kubectl.json("get", "pods", "-n", namespace, "-l", f"{JOB_NAME}={name}")["items"]
    throttled = sum(LABEL_NAME in (p["metadata"].get("labels") or {}) for p in made)
    kubectl("delete", "job", "-n", namespace, name, "--cascade=background", "--wait=false")
    kubectl("delete", "pods", "-n", namespace, "-l", f"{JOB_NAME}={name}",
            "--grace-period=0", "--force", "--wait=true", check=False)
    return {"all_seconds": latencies[-1], "p50_seconds": percentile(latencies, 0.5),
            "p99_seconds": percentile(latencies, 0.99), "throttled": throttled}


def run(cluster: Any, pods: int, pairs: int, tmp: Path) -> dict[str, Any]:
    kubectl = Kubectl(cluster.kubeconfig)
    kubectl("apply", "--server-side", "-f", str(ROOT / "charts/throttledjob/crds"))
    kubectl("wait", "--for=condition=Established", "crd/throttledjobs.throttledjob.io",
            "--timeout=60s")
    seen, unseen = "attach-bench-seen", "attach-bench-unseen"
    for ns in (seen, unseen):
        kubectl("create", "namespace", ns, check=False)
    runs: dict[str, list[dict[str, Any]]] = {"webhook": [], "baseline": []}
    try:
        with attach_operator(cluster, kubectl, seen, tmp, "tjbench") as op:
            op.start()
            wait_json(kubectl, lambda o: o["webhooks"][0]["clientConfig"].get("caBundle"),
                      "mutatingwebhookconfiguration",
                      op.env["THROTTLEDJOB_WEBHOOK_CONFIG"], what="the webhook's CA")
            tj = tj_manifest(THROTTLEDJOB, seen, throttle={
                "targets": {"cpu": {"peak": "500m"}}, "enforcement": "Quota"})
            del tj["spec"]["jobTemplate"]
            tj["spec"]["labeledWorkloads"] = {}
            kubectl.apply(tj)
            wait_json(kubectl, lambda t: (t.get("status") or {}).get("phase") == "Running",
                      "tj", "-n", seen, THROTTLEDJOB, what="the ThrottledJob Running")
            for i in range(pairs):
                order = ("baseline", "webhook") if i % 2 == 0 else ("webhook", "baseline")
                for side in order:
                    ns = seen if side == "webhook" else unseen
                    runs[side].append(burst(cluster, kubectl, ns, f"burst-{i}", pods))
    finally:
        for ns in (seen, unseen):
            kubectl("delete", "namespace", ns, "--wait=false", check=False)
    return figures(runs, pods)


def figures(runs: dict[str, list[dict[str, Any]]], pods: int) -> dict[str, Any]:
    """Medians over the rounds; the ratios of the webhook's to the baseline's."""
    def median(side: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[side])

    out: dict[str, Any] = {"pods": pods, "pairs": len(runs["webhook"])}
    for key in ("all_seconds", "p50_seconds", "p99_seconds"):
        for side in ("baseline", "webhook"):
            out[f"{side}_{key}"] = rounded(median(side, key))
        out[f"ratio_{key}"] = rounded(median("webhook", key) / median("baseline", key))
    out["webhook_pods_throttled"] = min(r["throttled"] for r in runs["webhook"])
    out["baseline_pods_throttled"] = max(r["throttled"] for r in runs["baseline"])
    return out


def table(out: dict[str, Any]) -> str:
    return markdown([{"figure": k, "value": v} for k, v in out.items()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=100, help="pods of each Job")
    parser.add_argument("--pairs", type=int, default=3,
                        help="rounds of both sides, the order alternating")
    args = parser.parse_args()
    with a_cluster() as cluster:
        out = run(cluster, args.pods, args.pairs,
                  Path(tempfile.mkdtemp(prefix="tj-attach-bench-")))
    print(json.dumps(out, indent=1))
    print(table(out))


if __name__ == "__main__":
    main()
