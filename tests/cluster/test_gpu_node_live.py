"""GPUs on the test cluster as a real cluster gets them: a device plugin registers two fake
`nvidia.com/gpu` (tools/k8s/fake_gpus.py, the simulated board's UUIDs) with the real
node's kubelet; pods request them as on a GPU node, the kubelet allocates them, and its
PodResources API says which pod holds which (what the GPU node agent reads:
node/pod_resources.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from testing.cluster_cli import Kubectl, wait_json
from throttledjob.node.pod_resources import gpus_by_pod
from throttledjob.sidecar.gpu.fake import fake_uuid
from tools.k8s import images

pytestmark = pytest.mark.timeout(600)
POD_TIMEOUT = 120.0


@pytest.fixture(scope="module")
def fake_gpus(real_node: Any) -> Iterator[Any]:
    """Two fake GPUs on the real node; ones `make cluster WITH=fake-gpus` registered are
    used and left."""
    started = real_node.allocatable("nvidia.com/gpu") != "2"
    if started:
        real_node.start_fake_gpus(2)
    yield real_node
    if started:
        real_node.stop_fake_gpus()


def gpu_pod(namespace: str) -> dict[str, Any]:
    """A pod of the product image asking for one GPU, printing the GPU it was given."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"gpu-{uuid.uuid4().hex[:6]}", "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "main", "image": images.PRODUCT_IMAGE, "imagePullPolicy": "Never",
                "command": ["python", "-c", "import os, time; "
                            "print(os.environ.get('NVIDIA_VISIBLE_DEVICES'), flush=True); "
                            "time.sleep(300)"],
                "resources": {"limits": {"nvidia.com/gpu": 1}},
                "securityContext": {"allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }


def test_pods_get_the_fake_gpus_and_the_kubelet_says_which_pod_holds_which(
        fake_gpus: Any, kubectl: Kubectl, namespace: str) -> None:
    pods = [gpu_pod(namespace) for _ in range(3)]
    for pod in pods:
        kubectl.apply(pod)
    names = [p["metadata"]["name"] for p in pods]
    for name in names[:2]:
        wait_json(kubectl, lambda p: p["status"].get("phase") == "Running", "pod", "-n",
                  namespace, name, what=f"pod {name} running", timeout=POD_TIMEOUT)
    # Two GPUs: the third waits for one, as on a node whose GPUs are all taken.
    third = wait_json(kubectl, lambda p: any(
        c["type"] == "PodScheduled" and c["status"] == "False"
        for c in p["status"].get("conditions") or []), "pod", "-n", namespace, names[2],
        what="the third pod unschedulable", timeout=POD_TIMEOUT)
    assert "nvidia.com/gpu" in str(third["status"]["conditions"]), third["status"]

    held = gpus_by_pod(fake_gpus.pod_resources_socket)
    mine = {name: held.get(f"{namespace}/{name}") for name in names}
    assert {mine[names[0]], mine[names[1]]} == {frozenset({fake_uuid(0)}),
                                                frozenset({fake_uuid(1)})}, held
    assert mine[names[2]] is None
    for name in names[:2]:   # each container told its own GPU, as NVIDIA's plugin tells it
        told = kubectl("logs", "-n", namespace, name).stdout.split()
        assert told == sorted(mine[name]), (name, told)
    for name in names:
        kubectl("delete", "pod", "-n", namespace, name, "--wait=false")
