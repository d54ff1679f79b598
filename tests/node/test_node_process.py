"""The node agent's process (node/process.py) on one machine: its /metrics (what promtool
accepts, each GPU's limit, a capped GPU's original and its pod) and what it does while
the kubelet does not answer."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from testing.helpers import require_tool
from throttledjob.gpu.fake import TDP_WATTS, FakeGpuBackend, fake_uuid
from throttledjob.node.identity import PodRef
from throttledjob.node.metrics import make_registry
from throttledjob.node.process import ASSIGNMENTS_TTL_SECONDS, Node

POD = PodRef("team", "train-a", "8b1f7f4e-0000-4000-8000-00000000000a", power_cap=True)


def test_the_agents_metrics_say_each_gpus_limit_and_who_holds_it(tmp_path: Path) -> None:
    """With --metrics-pod-names (without, tests/node/test_node_under_attack.py)."""
    board = FakeGpuBackend(2, "steady")
    node = Node(board, tmp_path, tmp_path / "state",
                list_gpus=lambda: {POD.key: frozenset({fake_uuid(0)})})
    node.keeper.set_limit(board.read()[0], POD, 150.0)
    text = generate_latest(make_registry(node, pod_names=True)).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    uuid0, uuid1 = fake_uuid(0), fake_uuid(1)
    assert samples[("throttledjob_node_gpu_power_limit_watts",
                    (("UUID", uuid0), ("gpu", "0")))] == 150.0
    assert samples[("throttledjob_node_gpu_power_limit_watts",
                    (("UUID", uuid1), ("gpu", "1")))] == TDP_WATTS
    pod = (("UUID", uuid0), ("namespace", "team"), ("pod", "train-a"))
    assert samples[("throttledjob_node_gpu_original_power_limit_watts", pod)] == TDP_WATTS
    assert samples[("throttledjob_node_gpu_pod_info", pod)] == 1.0
    assert samples[("throttledjob_node_pods_served", ())] == 0
    check = subprocess.run([require_tool("promtool"), "check", "metrics"], input=text,
                           capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr


def test_while_the_kubelet_does_not_answer_its_last_answer_stands(tmp_path: Path) -> None:
    """A kubelet restart: PodResources does not answer for a while. The pods keep their
    GPUs (a sidecar told "no GPU of this pod" would give them up for good), and no cap is
    put back on that account."""
    import grpc

    class Down(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAVAILABLE

    answers: list = [{"team/train-a": frozenset({fake_uuid(0)})}]

    def list_gpus():
        if not answers:
            raise Down()
        return answers[0]

    board = FakeGpuBackend(1, "steady")
    node = Node(board, tmp_path, tmp_path / "state", list_gpus=list_gpus)
    assert node.assignments() == {"team/train-a": frozenset({fake_uuid(0)})}
    (tmp_path / "mount").mkdir()
    node.publish(tmp_path / "mount", POD)   # its volume served
    node.keeper.set_limit(board.read()[0], POD, 150.0)
    answers.clear()
    time.sleep(ASSIGNMENTS_TTL_SECONDS + 0.1)   # past the last answer's freshness
    assert node.assignments() == {"team/train-a": frozenset({fake_uuid(0)})}
    node.tidy()
    assert board.limits == [150.0]
    node.stop()


def test_a_served_pod_the_kubelet_lists_without_its_gpu_keeps_its_cap_for_a_grace(
        tmp_path: Path, monkeypatch) -> None:
    """A kubelet just restarted lists a running pod before its devices: the cap of a pod
    whose volume is still published stays through that, and goes once the kubelet has
    left the GPU out for the whole grace (it never unpublished the pod); listed again
    within it, nothing is put back and the grace starts anew."""
    from throttledjob.node import process

    monkeypatch.setattr(process, "GONE_GRACE_SECONDS", 0.5)
    listed = {POD.key: frozenset({fake_uuid(0)})}
    board = FakeGpuBackend(1, "steady")
    node = Node(board, tmp_path, tmp_path / "state", list_gpus=lambda: dict(listed))
    (tmp_path / "mount").mkdir()
    node.publish(tmp_path / "mount", POD)
    node.keeper.set_limit(board.read()[0], POD, 150.0)
    listed[POD.key] = frozenset()   # restarting: the pod, not yet its GPU
    node.tidy()
    assert board.limits == [150.0]
    time.sleep(0.3)
    listed[POD.key] = frozenset({fake_uuid(0)})   # back within the grace
    node.tidy()
    listed[POD.key] = frozenset()
    node.tidy()   # the grace starts anew here
    time.sleep(0.3)
    node.tidy()
    assert board.limits == [150.0]
    time.sleep(0.3)
    node.tidy()
    assert board.limits == [TDP_WATTS] and node.keeper.caps == {}
    node.stop()
