"""The node agent's own /metrics: each GPU's power limit in force, the limit a capped GPU
had before (the one it gets back), and, where asked (`--metrics-pod-names`), which pod
holds each GPU and asked for each cap: anyone who reaches the port would read which pod
of which namespace holds which GPU at which limit. Read at each scrape; a GPU that cannot
be read is left out of that scrape.

Served by the bounded server the sidecar serves with too (serving.py): a thread per
connection, at most MAX_CONNECTIONS of them and MAX_PER_CLIENT from one address, each timed
out. Idle connections by the thousand cost the agent a few threads, and never a restore.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from throttledjob.gpu.backend import GpuError
from throttledjob.serving import CONNECTION_TIMEOUT_SECONDS, BoundedHTTPServer

from .process import Node

P = "throttledjob_node_"


class NodeCollector:
    def __init__(self, node: Node, pod_names: bool = False) -> None:
        self.node, self.pod_names = node, pod_names

    def collect(self) -> Iterator[Metric]:
        pods = ["namespace", "pod"] if self.pod_names else []
        limit = GaugeMetricFamily(P + "gpu_power_limit_watts",
                                  "Power limit in force on each GPU of the node, in watts.",
                                  labels=["UUID", "gpu"])
        original = GaugeMetricFamily(
            P + "gpu_original_power_limit_watts",
            "The limit a GPU capped by the agent had before, in watts: the one it gets "
            "back when its pod ends.", labels=["UUID", *pods])
        try:
            readings = self.node.keeper.backend.read_as("metrics")
        except GpuError:
            readings = []
        for r in readings:
            if r.power_limit_watts is not None:
                limit.add_metric([r.uuid, str(r.index)], r.power_limit_watts)
        for uuid, cap in sorted(self.node.keeper.caps.items()):
            original.add_metric([uuid, *cap.pod.split("/", 1)][:1 + len(pods)],
                                cap.original_watts)
        served = GaugeMetricFamily(P + "pods_served",
                                   "Pods with a socket to the agent now (their CSI volume).",
                                   value=len(self.node.listeners))
        yield from (limit, original, served)
        if self.pod_names:
            holder = GaugeMetricFamily(
                P + "gpu_pod_info", "1 for each GPU and the pod the kubelet allocated it to.",
                labels=["UUID", *pods])
            for pod, uuids in sorted(self.node.assignments().items()):
                for uuid in sorted(uuids):
                    holder.add_metric([uuid, *pod.split("/", 1)], 1.0)
            yield holder


def make_registry(node: Node, pod_names: bool = False) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(node, pod_names))
    return registry


def serve_metrics(node: Node, port: int, pod_names: bool = False,
                  host: str = "0.0.0.0") -> BoundedHTTPServer:
    """GET /metrics on `port`, on a daemon thread; anything else is a 404."""
    registry = make_registry(node, pod_names)

    class Handler(BaseHTTPRequestHandler):
        timeout = CONNECTION_TIMEOUT_SECONDS   # per socket operation

        def do_GET(self) -> None:
            found = self.path.split("?", 1)[0] == "/metrics"
            body = generate_latest(registry) if found else b"not found: try /metrics\n"
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST if found else "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass   # a line per scrape would drown the agent's own log

    server = BoundedHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="throttledjob-node-metrics",
                     daemon=True).start()
    return server
