"""The node agent's liveness probe, run by the kubelet in the agent's container:
`python -m throttledjob.node.probe <the driver's csi.sock>`. A real round trip: the CSI
driver's Probe, answered by the agent's own gRPC workers, which fail it once the agent's
tidying passes stopped (process.py `Node.health`). A socket file that is there says
nothing of a wedged agent; this does. Exits 0 when alive, 1 with one line why not."""

from __future__ import annotations

import sys

import grpc

from .kubelet import csi_pb2 as csi
from .kubelet import csi_pb2_grpc as csi_rpc

TIMEOUT_SECONDS = 4.0   # under the probe's own timeoutSeconds (5)


def probe(socket: str, timeout_seconds: float = TIMEOUT_SECONDS) -> str | None:
    """Why the agent behind `socket` is not alive (None: it answered that it is)."""
    try:
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            csi_rpc.IdentityStub(channel).Probe(csi.ProbeRequest(), timeout=timeout_seconds)
    except grpc.RpcError as e:
        return f"{e.code().name}: {e.details()}"
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m throttledjob.node.probe CSI_SOCKET\n")
        return 2
    why = probe(argv[0])
    if why:
        sys.stderr.write(f"throttledjob node: not alive: {why}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
