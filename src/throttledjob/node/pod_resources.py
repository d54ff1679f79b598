"""Which pod holds which GPU, as the kubelet allocated them: its PodResources API (`List`,
gRPC on a Unix socket in `<kubelet root>/pod-resources`, which the agent mounts
read-only).

Device IDs are what the device plugin advertised: a GPU's UUID for NVIDIA's plugin and
for the test cluster's fake one, with a `::N` suffix where the plugin time-slices one
GPU into N replicas (each replica an ID of its own, the same GPU). The kubelet names pods
by namespace and name here, not by UID.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import grpc

from throttledjob.contracts.names import GPU_RESOURCE

from .kubelet import podresources_pb2 as pb
from .kubelet import podresources_pb2_grpc as rpc


def socket_path(kubelet_dir: Path) -> Path:
    """Where a kubelet of that root directory serves it (the chart mounts its directory
    read-only: a socket is dialled, not written)."""
    return kubelet_dir / "pod-resources" / "kubelet.sock"


# Where the kubelet serves it by default (its --root-dir is /var/lib/kubelet).
SOCKET = socket_path(Path("/var/lib/kubelet"))


def gpu_uuid(device_id: str) -> str:
    """The GPU of a device ID (a time-sliced replica's `::N` left off)."""
    return device_id.split("::", 1)[0]


def gpus_by_pod(socket: Path = SOCKET, resource: str = GPU_RESOURCE,
                timeout_seconds: float = 5.0) -> Mapping[str, frozenset[str]]:
    """"namespace/name" -> the UUIDs of the GPUs its containers were allocated; pods
    with none are left out. Raises grpc.RpcError where the kubelet does not answer."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        listed = rpc.PodResourcesListerStub(channel).List(pb.ListPodResourcesRequest(),
                                                          timeout=timeout_seconds)
    out: dict[str, frozenset[str]] = {}
    for pod in listed.pod_resources:
        gpus = frozenset(gpu_uuid(d) for c in pod.containers for dev in c.devices
                         if dev.resource_name == resource for d in dev.device_ids)
        if gpus:
            out[f"{pod.namespace}/{pod.name}"] = gpus
    return out
