"""The node agent's own /metrics: each GPU's power limit in force, the limit a capped GPU
had before (the one it gets back), and which pod the kubelet gave it to. Read at each
scrape; a GPU that cannot be read is left out of that scrape."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

from throttledjob.sidecar.gpu.backend import GpuError

from .process import Node

P = "throttledjob_node_"


class NodeCollector:
    def __init__(self, node: Node) -> None:
        self.node = node

    def collect(self) -> Iterator[Metric]:
        limit = GaugeMetricFamily(P + "gpu_power_limit_watts",
                                  "Power limit in force on each GPU of the node, in watts.",
                                  labels=["UUID", "gpu"])
        original = GaugeMetricFamily(
            P + "gpu_original_power_limit_watts",
            "The limit a GPU capped by the agent had before, in watts: the one it gets "
            "back when its pod ends.", labels=["UUID", "namespace", "pod"])
        holder = GaugeMetricFamily(P + "gpu_pod_info",
                                   "1 for each GPU and the pod the kubelet allocated it to.",
                                   labels=["UUID", "namespace", "pod"])
        try:
            readings = self.node.keeper.backend.read_as("metrics")
        except GpuError:
            readings = []
        for r in readings:
            if r.power_limit_watts is not None:
                limit.add_metric([r.uuid, str(r.index)], r.power_limit_watts)
        for uuid, cap in sorted(self.node.keeper.caps.items()):
            original.add_metric([uuid, *cap.pod.split("/", 1)], cap.original_watts)
        for pod, uuids in sorted(self.node.assignments().items()):
            for uuid in sorted(uuids):
                holder.add_metric([uuid, *pod.split("/", 1)], 1.0)
        served = GaugeMetricFamily(P + "pods_served",
                                   "Pods with a socket to the agent now (their CSI volume).",
                                   value=len(self.node.listeners))
        yield from (limit, original, holder, served)


def make_registry(node: Node) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(node))
    return registry
