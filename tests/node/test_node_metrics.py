"""The node agent's /metrics: what promtool accepts, and each GPU's limit, a capped GPU's
original and its pod, as the agent holds them."""

from __future__ import annotations

import subprocess
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from testing.helpers import require_tool
from throttledjob.node.metrics import make_registry
from throttledjob.node.process import Node
from throttledjob.sidecar.gpu.fake import TDP_WATTS, FakeGpuBackend, fake_uuid


def test_the_agents_metrics_say_each_gpus_limit_and_who_holds_it(tmp_path: Path) -> None:
    board = FakeGpuBackend(2, "steady")
    node = Node(board, tmp_path, tmp_path / "state",
                list_gpus=lambda: {"team/train-a": frozenset({fake_uuid(0)})})
    node.keeper.set_limit(board.read()[0], "team/train-a", 150.0)
    text = generate_latest(make_registry(node)).decode()
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
