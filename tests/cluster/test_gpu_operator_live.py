"""A GPU ThrottledJob on the real node, end to end, as a cluster with the chart's node
agent runs it: the fake device plugin's two GPUs (tools/k8s/fake_gpus.py), the chart with
`gpu.nodeAgent` on (its DaemonSet on the simulated board, keyed by the same UUIDs, and
its CSIDriver), Pod Security "restricted". The pod's sidecar reaches the agent through
the CSI volume the operator gave it: its /status shows its GPU and no other, the power
target is held by the board's cap (levers.gpuPowerLimit: Allow), which the agent keeps on
the node with the original limit and puts back when the pod ends."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testing.cluster_cli import Kubectl, helm, wait_json
from testing.manifests import make_tj
from testing.paths import CHART, ROOT
from throttledjob.gpu.fake import TDP_WATTS, fake_uuid
from throttledjob.operator import api_names
from throttledjob.operator.budget_crd import BUDGET_KIND
from tools.k8s import images

pytestmark = pytest.mark.timeout(900)
ONE_MACHINE_VALUES = ROOT / "examples/one-machine/values.yaml"
TARGET_WATTS = 200.0
# A node label no node has: the DaemonSet's pod leaves the node while its nodeSelector
# names it, for longer than the sidecar's three failed reads (intervalSeconds 1).
AWAY = "throttledjob.io/test-away"
AWAY_SECONDS = 6


@pytest.fixture(scope="module")
def gpu_cluster(cluster: Any, kubectl: Kubectl, real_node: Any,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The chart with the node agent on the fake GPUs; yields the watched namespace and
    the agent's state directory on the node."""
    real_node.start_fake_gpus(2)
    release = f"gpu-{uuid.uuid4().hex[:6]}"
    system, watched = f"{release}-system", f"{release}-jobs"
    state = tmp_path_factory.mktemp("node-agent")
    for ns in (system, watched):
        kubectl("create", "namespace", ns)
        kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    # The agent's namespace runs a privileged DaemonSet: "privileged" there, as any
    # node agent's (the operator's pods keep "restricted" by their own spec).
    kubectl("label", "--overwrite", "namespace", system,
            "pod-security.kubernetes.io/enforce=privileged")
    ours = tmp_path_factory.mktemp("values") / "values.yaml"
    ours.write_text(json.dumps({
        "watchNamespaces": [watched], "operator": {"statusIntervalSeconds": 2},
        "gpu": {"nodeAgent": {"enabled": True, "backend": "fake", "powerCap": True,
                              "kubeletDir": str(real_node.dir / "kubelet"),
                              "stateDir": str(state)}}}))
    try:
        helm(cluster, "install", release, str(CHART), "-n", system, "-f",
             str(ONE_MACHINE_VALUES), "-f", str(ours), "--wait", "--timeout", "180s")
        yield watched, state
    finally:
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            helm(cluster, "uninstall", release, "-n", system, "--wait", "--timeout", "60s")
        for ns in (system, watched):
            kubectl("delete", "namespace", ns, "--wait=false", check=False)


def gpu_tj(name: str, namespace: str, seconds: int, cap: bool = True) -> dict[str, Any]:
    throttle = {"targets": {"gpu": {"peakPowerWatts": TARGET_WATTS}},
                "maxSlowdown": 2, "intervalSeconds": 1}
    if cap:
        throttle["levers"] = {"gpuPowerLimit": "Allow"}
    tj = make_tj(name, throttle=throttle, terminationGracePeriodSeconds=1)
    tj["metadata"]["namespace"] = namespace
    (c,) = tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    c.update(image=images.PRODUCT_IMAGE, imagePullPolicy="Never",
             command=["python", "-c", f"import time; time.sleep({seconds})"],
             resources={"requests": {"cpu": "50m"},
                        "limits": {"nvidia.com/gpu": 1, "memory": "128Mi"}})
    return tj


def caps(state: Path) -> dict[str, tuple[float, str]]:
    """GPU UUID -> (its limit before the cap, the pod that asked), as on record."""
    path = state / "caps.json"
    caps = json.loads(path.read_text())["caps"] if path.exists() else {}
    return {uuid: (c["original_watts"], c["pod"]) for uuid, c in caps.items()}


def sidecar_status(pod: dict[str, Any]) -> dict[str, Any]:
    url = f"http://{pod['status']['podIP']}:9400/status"
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def read_gpus(kubectl: Kubectl, namespace: str, selector: str) -> list[dict[str, Any]]:
    """The GPUs a pod's sidecar reads, once it reads one (within a minute)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pods = kubectl.json("get", "pods", "-n", namespace, "-l", selector)["items"]
        with contextlib.suppress(OSError, ValueError, IndexError, KeyError):
            gpus = sidecar_status(pods[0])["telemetry"]["gpus"]
            if gpus:
                return gpus
        time.sleep(1)
    raise AssertionError(f"{selector}: no GPU read within a minute")


def test_gpu_throttledjobs_read_their_own_gpus_and_only_the_opted_in_one_is_capped(
        gpu_cluster: tuple[str, Path], kubectl: Kubectl) -> None:
    namespace, state = gpu_cluster
    # Beside it, one on the other GPU without the opt-in: never capped.
    kubectl.apply(gpu_tj("capped", namespace, 45), gpu_tj("uncapped", namespace, 15, cap=False))
    selector = "throttledjob.io/name=capped"
    kubectl("wait", "--for=create", "job/capped", "-n", namespace, "--timeout=60s")

    def capped_and_read() -> Any:
        pods = kubectl.json("get", "pods", "-n", namespace, "-l", selector)["items"]
        if not pods or not pods[0]["status"].get("podIP"):
            return None
        with contextlib.suppress(OSError, ValueError):
            status = sidecar_status(pods[0])
            if status["telemetry"]["gpus"] and caps(state):
                return pods[0], status
        return None

    deadline, got = time.monotonic() + 120, None
    while got is None and time.monotonic() < deadline:
        got = capped_and_read()
        time.sleep(1)
    assert got, f"no capped GPU read through the agent; caps {caps(state)}"
    pod, status = got
    (gpu,) = status["telemetry"]["gpus"]
    assert gpu["UUID"] in (fake_uuid(0), fake_uuid(1)), status["telemetry"]
    assert status["telemetry"]["gpu"] == "fake (simulated)"
    key = f"{namespace}/{pod['metadata']['name']}"
    assert caps(state) == {gpu["UUID"]: (TDP_WATTS, key)}
    seen = read_gpus(kubectl, namespace, "throttledjob.io/name=uncapped")
    assert [g["UUID"] for g in seen] == [u for u in (fake_uuid(0), fake_uuid(1))
                                          if u != gpu["UUID"]], seen
    # Held by the cap: the board draws what the cap lets it (the controller's setpoint,
    # 3% under the target), where unthrottled it drew its full 288 W.
    time.sleep(3)
    assert list(caps(state)) == [gpu["UUID"]]   # still not the other pod's
    with urllib.request.urlopen(f"http://{pod['status']['podIP']}:9400/metrics",
                                timeout=5) as r:
        metrics = r.read().decode()
    def gauge(name: str) -> float:
        (value,) = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                    if line.split("{")[0].split(" ")[0] == name]
        return value

    power = gauge("throttledjob_gpu_power_watts")
    assert power == pytest.approx(TARGET_WATTS * 0.97, abs=1.0), power
    # The cap holds all of it: the workload is not held back as well.
    assert gauge("throttledjob_gpu_duty_ratio") == 0.0, metrics
    # The ThrottledJob's own status says what held it and what the GPU drew.
    observed = wait_json(kubectl, lambda t: "gpu_power_limit" in
                         t.get("status", {}).get("observed", {}).get("levers", []),
                         "throttledjob", "-n", namespace, "capped",
                         what="status.observed to name the power cap", timeout=30,
                         )["status"]["observed"]
    assert 0 < observed["gpuPeakPowerWatts"] <= 288.0, observed
    assert observed["gpus"] == [gpu["UUID"]], observed
    # The agent's own /metrics says the same: the cap and the original.
    (agent,) = kubectl.json("get", "pods", "-A", "-l",
                            "app.kubernetes.io/component=node-agent")["items"]
    with urllib.request.urlopen(f"http://{agent['status']['podIP']}:9401/metrics",
                                timeout=5) as r:
        text = r.read().decode()
    labels = f'UUID="{gpu["UUID"]}"'
    assert f"throttledjob_node_gpu_original_power_limit_watts{{{labels}}} {TDP_WATTS}" in text
    # No pod named to whoever reaches the port (gpu.nodeAgent.metricsPodNames is off).
    assert pod["metadata"]["name"] not in text and "gpu_pod_info" not in text
    # No agent on the node for a while (a roll whose new pod waits for its image, a node
    # drained of it): the DaemonSet sent elsewhere, then back. The old agent puts the cap
    # back at its SIGTERM; the pod's sidecar, CPU-only while no agent answers (more than
    # three reads), reads its GPU and caps it again once the new agent serves its volume.
    daemonset = ["daemonset", "-n", agent["metadata"]["namespace"],
                 agent["metadata"]["ownerReferences"][0]["name"]]
    def send(value: str | None) -> None:
        kubectl("patch", *daemonset, "--type", "merge", "-p", json.dumps(
            {"spec": {"template": {"spec": {"nodeSelector": {AWAY: value}}}}}))
    send("elsewhere")
    kubectl("wait", "--for=delete", "pod", "-n", agent["metadata"]["namespace"],
            agent["metadata"]["name"], "--timeout=60s")
    assert caps(state) == {}, "the agent left its cap behind"
    time.sleep(AWAY_SECONDS)
    away = sidecar_status(pod)
    assert away["telemetry"]["gpus"] == [], away["telemetry"]
    send(None)
    capped_again = {gpu["UUID"]: (TDP_WATTS, key)}
    deadline = time.monotonic() + 30   # the pod runs on for about 25 s more
    while caps(state) != capped_again and time.monotonic() < deadline:
        time.sleep(1)
    assert caps(state) == capped_again, "not capped again once the agent was back"
    again = sidecar_status(pod)
    assert [g["UUID"] for g in again["telemetry"]["gpus"]] == [gpu["UUID"]], again
    for name in ("capped", "uncapped"):
        wait_json(kubectl, lambda j: j["status"].get("succeeded") == 1, "job", "-n",
                  namespace, name, what=f"job {name} to complete", timeout=120)
    deadline = time.monotonic() + 60
    while caps(state) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert caps(state) == {}, "the cap outlived its pod"


GPU_BUDGET_WATTS = 360.0
DROP = 0.6


def pod_of(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    (pod,) = kubectl.json("get", "pods", "-n", namespace, "-l",
                          f"throttledjob.io/name={name}")["items"]
    return pod


def test_a_gpu_watt_budget_splits_between_two_members_and_their_caps_hold_it(
        gpu_cluster: tuple[str, Path], kubectl: Kubectl) -> None:
    """A ThrottleBudget of 360 W over two members of one GPU each, whose boards would
    draw 285-288 W unheld (the simulated board at its plateau) and whose own targets
    (280 W) do not bind: each is made at, or re-split to within the kubelet's refresh of
    its policy, 180 W; the node agent caps both boards, their draw together stays under
    the budget, and the budget's status shows what each would draw unheld. Dropped to
    60%, the sidecars hold the new shares once the kubelet refreshes their policy."""
    namespace, state = gpu_cluster
    budget = {"apiVersion": api_names.API_VERSION, "kind": BUDGET_KIND,
              "metadata": {"name": "hall", "namespace": namespace},
              "spec": {"selector": {"matchLabels": {"power": "hall"}}}}
    refused = kubectl.apply(budget, check=False)  # neither a CPU nor a GPU peak
    assert refused.returncode != 0 and "needs cpu.peak or gpu.peakWatts" in refused.stderr
    budget["spec"]["gpu"] = {"peakWatts": GPU_BUDGET_WATTS}
    kubectl.apply(budget)
    members = []
    for name in ("pa", "pb"):
        tj = gpu_tj(name, namespace, 300)
        tj["metadata"]["labels"] = {"power": "hall"}
        tj["spec"]["throttle"]["targets"]["gpu"]["peakPowerWatts"] = 280
        members.append(tj)
    started = time.monotonic()
    kubectl.apply(*members)
    statuses: dict[str, dict[str, Any]] = {}

    def held() -> bool:
        for name in ("pa", "pb"):
            pods = kubectl.json("get", "pods", "-n", namespace, "-l",
                                f"throttledjob.io/name={name}")["items"]
            with contextlib.suppress(OSError, ValueError, IndexError, KeyError):
                statuses[name] = sidecar_status(pods[0])
        targets = [s["targets"]["gpuPeakPowerWatts"] for s in statuses.values()]
        return len(targets) == 2 and sum(targets) <= GPU_BUDGET_WATTS and len(caps(state)) == 2

    deadline = time.monotonic() + 180
    while not held() and time.monotonic() < deadline:
        time.sleep(1)
    within = time.monotonic() - started
    assert held(), f"not held within the budget: {statuses}, caps {caps(state)}"
    print(f"both members' policies within the GPU budget {within:.0f} s after they were made")
    for s in statuses.values():  # half each, give or take a re-split by demand
        assert s["targets"]["gpuPeakPowerWatts"] == pytest.approx(180.0, abs=10), statuses
    # The caps hold it: the boards draw at the controller's setpoint under each share.
    time.sleep(3)
    draws = []
    for name in ("pa", "pb"):
        pod = pod_of(kubectl, namespace, name)
        with urllib.request.urlopen(f"http://{pod['status']['podIP']}:9400/metrics",
                                    timeout=5) as r:
            draws += [float(line.rsplit(" ", 1)[1]) for line in r.read().decode().splitlines()
                      if line.startswith("throttledjob_gpu_power_watts{")]
    assert len(draws) == 2 and sum(draws) <= GPU_BUDGET_WATTS, draws
    # Weighed by what each would draw unheld, once read three times (2-s status interval).
    status = wait_json(kubectl, lambda b: [m.get("demandWatts") is not None
                                           for m in (b.get("status") or {}).get("members")
                                           or []] == [True, True],
                       "throttlebudget", "-n", namespace, "hall",
                       what="the GPU split by measured demand", timeout=60)["status"]
    assert status["gpuBudgetWatts"] == GPU_BUDGET_WATTS
    assert status["gpuFloorWatts"] == 200.0  # two boards whose limits go down to 100 W
    for m in status["members"]:
        assert m["demandWatts"] == pytest.approx(287.0, rel=0.05), status
        assert 100 <= m["shareWatts"] <= 260, status
    assert sum(m["shareWatts"] for m in status["members"]) <= GPU_BUDGET_WATTS
    # A drop to 60% (a grid signal): the shares fall at once; the sidecars hold the new
    # ones when the kubelet refreshes their policy (its periodic sync of the pods).
    dropped = time.monotonic()
    kubectl("patch", "throttlebudget", "-n", namespace, "hall", "--type=merge",
            "-p", json.dumps({"spec": {"signal": {"fraction": DROP}}}))
    deadline, targets = time.monotonic() + 150, [GPU_BUDGET_WATTS]
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, KeyError):
            targets = [sidecar_status(pod)["targets"]["gpuPeakPowerWatts"]
                       for pod in (pod_of(kubectl, namespace, n) for n in ("pa", "pb"))]
            if sum(targets) <= GPU_BUDGET_WATTS * DROP:
                break
        time.sleep(1)
    followed = time.monotonic() - dropped
    assert sum(targets) <= GPU_BUDGET_WATTS * DROP, targets
    print(f"the sidecars held the dropped GPU budget {followed:.0f} s after the patch")
    kubectl("delete", "throttledjob", "-n", namespace, "pa", "pb", "--wait=false")
