"""How a pod's sidecar reaches the node agent: a CSI ephemeral volume in the pod
(`csi: {driver: node.throttledjob.io}`), for which the agent is the driver.

When the kubelet sets up such a volume it calls NodePublishVolume with the pod's
namespace, name and UID (the CSIDriver asks for them: `podInfoOnMount`) and a directory;
the agent makes that pod's socket there and the kubelet mounts the directory into that
pod's containers alone, read-only (`csi.readOnly`: a publish that is not is refused, so
no pod writes into the directory the agent works in). When the pod goes,
NodeUnpublishVolume: the pod's caps put back, then the socket closed. Unlike a hostPath,
a CSI volume is allowed under Pod Security "restricted". The kubelet finds the driver
through its plugin watcher: a registration socket in a directory of the driver's own
under `<kubelet root>/plugins_registry` (the watcher looks into subdirectories; the agent
mounts that one alone, not the other plugins' sockets). Every refusal is one line in the
agent's log and the kubelet's error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc

from throttledjob import __version__
from throttledjob.contracts.names import NODE_CSI_DRIVER as DRIVER
from throttledjob.contracts.names import NODE_POWER_CAP_ATTRIBUTE, NODE_SOCKET

from .identity import PodRef
from .kubelet import csi_pb2 as csi
from .kubelet import csi_pb2_grpc as csi_rpc
from .kubelet import pluginregistration_pb2 as reg
from .kubelet import pluginregistration_pb2_grpc as reg_rpc

SOCKET_NAME = Path(NODE_SOCKET).name   # in each pod's volume
POD_INFO = "csi.storage.k8s.io/pod."
# "true" from the kubelet (podInfoOnMount) for an inline volume of a pod's spec alone, not
# a PersistentVolume's (whose attributes are the PV author's; the CSIDriver allows the
# Ephemeral mode alone, this holds where it was changed). The kubelet's keys are written
# over any of the same name in the volume's attributes.
EPHEMERAL = "csi.storage.k8s.io/ephemeral"
log = logging.getLogger("throttledjob.node")


class OneVolumeAPod(ValueError):
    """A pod's second volume of the driver (process.py): the kubelet is told, and never
    starts the pod."""


class _Plugin(csi_rpc.IdentityServicer, csi_rpc.NodeServicer, reg_rpc.RegistrationServicer):
    def __init__(self, node_name: str, endpoint: Path,
                 publish: Callable[[Path, PodRef], None],
                 unpublish: Callable[[Path], None],
                 health: Callable[[], str | None] = lambda: None) -> None:
        self.node_name, self.endpoint = node_name, endpoint
        self.publish, self.unpublish, self.health = publish, unpublish, health

    # The kubelet's plugin watcher (pluginregistration v1).
    def GetInfo(self, request, context):
        return reg.PluginInfo(type="CSIPlugin", name=DRIVER, endpoint=str(self.endpoint),
                              supported_versions=["1.0.0"])

    def NotifyRegistrationStatus(self, request, context):
        if not request.plugin_registered:
            log.error("throttledjob node: the kubelet refused the CSI driver: %s", request.error)
        return reg.RegistrationStatusResponse()

    # CSI Identity.
    def GetPluginInfo(self, request, context):
        return csi.GetPluginInfoResponse(name=DRIVER, vendor_version=__version__)

    def GetPluginCapabilities(self, request, context):
        return csi.GetPluginCapabilitiesResponse()   # a node plugin only

    def Probe(self, request, context):
        # The liveness probe's round trip (probe.py): a wedged agent is restarted.
        why = self.health()
        if why:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, why)
        return csi.ProbeResponse()

    # CSI Node.
    def NodeGetCapabilities(self, request, context):
        return csi.NodeGetCapabilitiesResponse()

    def NodeGetInfo(self, request, context):
        return csi.NodeGetInfoResponse(node_id=self.node_name)

    def NodePublishVolume(self, request, context):
        info = request.volume_context
        pod = PodRef(info.get(POD_INFO + "namespace", ""), info.get(POD_INFO + "name", ""),
                     info.get(POD_INFO + "uid", ""),
                     power_cap=info.get(NODE_POWER_CAP_ATTRIBUTE) == "true")
        if not (pod.namespace and pod.name and pod.uid):
            _refuse(context, grpc.StatusCode.INVALID_ARGUMENT,
                    f"no pod information: the CSIDriver {DRIVER} needs podInfoOnMount")
        if info.get(EPHEMERAL) != "true":
            _refuse(context, grpc.StatusCode.INVALID_ARGUMENT,
                    f"{DRIVER} serves a pod's inline volume alone, not a PersistentVolume "
                    f"(pod {pod.key})")
        if not request.readonly:
            _refuse(context, grpc.StatusCode.INVALID_ARGUMENT,
                    f"pod {pod.key}: a volume of {DRIVER} is mounted read-only "
                    "(csi.readOnly: true), which the operator sets")
        target = Path(request.target_path)
        target.mkdir(parents=True, exist_ok=True)
        try:
            self.publish(target, pod)
        except OneVolumeAPod as e:
            _refuse(context, grpc.StatusCode.FAILED_PRECONDITION, str(e))
        return csi.NodePublishVolumeResponse()

    def NodeUnpublishVolume(self, request, context):
        self.unpublish(Path(request.target_path))
        return csi.NodeUnpublishVolumeResponse()


def _refuse(context: grpc.ServicerContext, code: grpc.StatusCode, why: str) -> None:
    log.warning("throttledjob node: refused: %s", why)
    context.abort(code, why)


def socket_paths(kubelet_dir: Path) -> tuple[Path, Path]:
    """The driver's socket and its registration's, under the kubelet's root directory:
    the chart mounts their directories (and no others of the kubelet's but PodResources
    and the pods' volumes, where `publish` is given each pod's directory)."""
    return (kubelet_dir / "plugins" / DRIVER / "csi.sock",
            kubelet_dir / "plugins_registry" / DRIVER / "reg.sock")


def serve_csi(kubelet_dir: Path, node_name: str, publish: Callable[[Path, PodRef], None],
              unpublish: Callable[[Path], None],
              health: Callable[[], str | None] = lambda: None) -> grpc.Server:
    """Serve the driver (`<kubelet root>/plugins/<driver>/csi.sock`) and its registration
    (`<kubelet root>/plugins_registry/<driver>-reg.sock`); the kubelet then calls
    `publish(directory, pod)` for each pod's volume and `unpublish(directory)`."""
    endpoint, registration = socket_paths(kubelet_dir)
    plugin = _Plugin(node_name, endpoint, publish, unpublish, health)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    csi_rpc.add_IdentityServicer_to_server(plugin, server)
    csi_rpc.add_NodeServicer_to_server(plugin, server)
    reg_rpc.add_RegistrationServicer_to_server(plugin, server)
    for path in (endpoint, registration):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        server.add_insecure_port(f"unix://{path}")
    server.start()
    return server
