"""A burst of ThrottledJobs and of edits through the real operator on the real API server:
every ThrottledJob gets exactly one Job and one ConfigMap, every edit reaches its own
ConfigMap and no other. Behaviour only; the figures at 1,000 are bench/operator_load.py's.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from testing.cluster_cli import Kubectl
from testing.helpers import wait_for
from testing.manifests import tj_manifest
from testing.operator_process import OperatorProcess

N = 60
EDITS = 30
# The operator handles 60 within a second here: the crash needs a longer burst to land in
# (the kill lands with the first Jobs made, 5-30 of them here).
CRASH_N = 100


def test_a_burst_of_throttledjobs_and_of_edits(kubectl: Kubectl, real_operator: OperatorProcess,
                                               namespace: str) -> None:
    real_operator.env["THROTTLEDJOB_RESYNC_INTERVAL"] = "3600"  # the event path only
    real_operator.verbose = False
    real_operator.start()
    names = [f"load-{i:03d}" for i in range(N)]
    kubectl.apply(*(tj_manifest(n, namespace, run_for="1h") for n in names))

    def listed(kind: str) -> list[str]:
        items = (kubectl.json("get", kind, "-n", namespace) or {}).get("items") or []
        return sorted(i["metadata"]["name"] for i in items
                      if i["metadata"]["name"] != "kube-root-ca.crt")

    wait_for(lambda: len(listed("jobs")) >= N, 240, interval=1, what=f"{N} Jobs")
    assert listed("jobs") == names  # one each, no duplicate
    wait_for(lambda: len(listed("configmaps")) >= N, 60, interval=1, what="the ConfigMaps")
    assert listed("configmaps") == [f"{n}-throttle" for n in names]

    want = {n: f"{1000 - i}m" for i, n in enumerate(names[::N // EDITS][:EDITS])}
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda n: kubectl(
            "patch", "tj", "-n", namespace, n, "--type=merge", "-p", json.dumps(
                {"spec": {"throttle": {"targets": {"cpu": {"peak": want[n]}}}}})), want))

    def peaks() -> dict[str, str]:
        import yaml

        items = kubectl.json("get", "configmaps", "-n", namespace)["items"]
        return {c["metadata"]["name"][:-len("-throttle")]: yaml.safe_load(
            c["data"]["policy.yaml"])["targets"]["cpu"]["peak"]
            for c in items if c["metadata"]["name"].endswith("-throttle")}

    wait_for(lambda: all(peaks().get(n) == v for n, v in want.items()), 240, interval=1,
             what=f"all {EDITS} edits in their ConfigMaps")
    assert {n: p for n, p in peaks().items() if n not in want} == {
        n: "1500m" for n in names if n not in want}
    assert listed("jobs") == names


def test_an_operator_killed_mid_burst_ends_with_one_job_each_and_a_true_status(
        kubectl: Kubectl, real_operator: OperatorProcess, namespace: str) -> None:
    """SIGKILL while a burst is half handled: some ThrottledJobs have their Job, some
    only their ConfigMap, some neither, some a Job whose status write was lost. The next
    operator finishes each one, adopting what exists (kopf's annotations tell it what
    was handled; the creates meet 409 and are adopted): one Job and one ConfigMap each,
    every status pointing at its Job."""
    real_operator.env["THROTTLEDJOB_RESYNC_INTERVAL"] = "3600"  # the event path only
    real_operator.status_interval = 10  # 100 running pods, no sidecar answering: idle
    real_operator.verbose = False
    real_operator.start()
    names = [f"crash-{i:03d}" for i in range(CRASH_N)]
    posted: list[Any] = []
    posting = threading.Thread(target=lambda: posted.append(kubectl.apply(
        *(tj_manifest(n, namespace, run_for="1h") for n in names), check=False)))
    posting.start()

    def listed(kind: str) -> list[str]:
        items = (kubectl.json("get", kind, "-n", namespace) or {}).get("items") or []
        return sorted(i["metadata"]["name"] for i in items
                      if i["metadata"]["name"] != "kube-root-ca.crt")

    wait_for(lambda: listed("jobs"), 240, interval=0.1, what="the first Jobs")
    real_operator.kill()
    made = len(listed("jobs"))
    print(f"killed with {made} of {CRASH_N} Jobs made")
    assert made < CRASH_N, "the burst was over before the kill: nothing tested"
    real_operator.start()
    posting.join()
    assert posted and posted[0].returncode == 0, posted
    wait_for(lambda: len(listed("jobs")) >= CRASH_N, 240, interval=1, what=f"{CRASH_N} Jobs")

    def statuses() -> dict[str, str | None]:
        items = kubectl.json("get", "tj", "-n", namespace)["items"]
        return {i["metadata"]["name"]: (i.get("status") or {}).get("jobName") for i in items}

    wait_for(lambda: all(statuses()[n] == n for n in names), 120, interval=1,
             what="every status pointing at its Job")
    assert listed("jobs") == names, f"killed with {made} of {CRASH_N} Jobs made"
    assert listed("configmaps") == [f"{n}-throttle" for n in names]
    owners = {j["metadata"]["name"]: [o["name"] for o in j["metadata"]["ownerReferences"]]
              for j in kubectl.json("get", "jobs", "-n", namespace)["items"]}
    assert owners == {n: [n] for n in names}
