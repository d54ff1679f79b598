"""The GPU device layer: backends behind one small interface, under both the pod's
sidecar (its GPU agent, sidecar/gpu_agent.py) and the node agent (node/).

backend.py       the GpuBackend interface, readings, errors, the null backend
nvml.py          the NVML adapter (pynvml)
node_backend.py  the pod's GPUs as the node agent serves them (throttledjob node): the
                 sidecar's side of the node agent's socket
fake.py          simulated GPUs (tests, demos, `--gpu-backend fake`)
power_limit.py   a board's power limit: the clamp a cap is set through, the precision a
                 limit is read back at

It imports neither the sidecar nor the node agent (tests/test_layers.py).
`open_backend` lives here rather than in backend.py so that the backends depend on the
interface and only this package entry depends on them (no import circle).
"""

from __future__ import annotations

import os
from pathlib import Path

from throttledjob.contracts.names import ENV_NODE_SOCKET, GPU_BACKENDS, NODE_SOCKET

from .backend import THROTTLE_REASONS, GpuBackend, GpuError, GpuReading, NullGpuBackend, select_gpus

__all__ = ["BACKENDS", "THROTTLE_REASONS", "GpuBackend", "GpuError", "GpuReading",
           "NullGpuBackend", "open_backend", "select_gpus"]

BACKENDS = GPU_BACKENDS


def open_backend(name: str, environ: dict[str, str] | None = None) -> tuple[GpuBackend, str]:
    """The backend for `--gpu-backend name` and a one-line note on what was chosen.

    "auto" takes the node agent where its socket is there (a pod on a node that runs it),
    and falls back to none when NVML is missing (the common case off a GPU node); an
    explicit "nvml" that cannot load raises GpuError so that a misconfiguration is loud.
    Simulated GPUs see no workload until a GPU agent drives them
    (sidecar/gpu_simulate.py: `follow`).
    """
    env = os.environ if environ is None else environ
    if name not in BACKENDS:
        raise GpuError(f"unknown GPU backend {name!r} (choose from {', '.join(BACKENDS)})")
    if name == "none":
        return NullGpuBackend(), "GPU telemetry off (--gpu-backend none)"
    if name == "fake":
        from .fake import FakeGpuBackend

        backend = FakeGpuBackend.from_environ(env)
        return backend, f"GPU telemetry simulated: {backend.describe()}"
    node_socket = Path(env.get(ENV_NODE_SOCKET) or NODE_SOCKET)
    if name == "node" or (name == "auto" and node_socket.exists()):
        from .node_backend import NodeAgentBackend

        return NodeAgentBackend(node_socket), f"GPU telemetry from the node agent ({node_socket})"
    from .nvml import NvmlBackend  # pynvml only when asked for

    try:
        backend = NvmlBackend()
    except GpuError as e:
        if name == "nvml":
            raise
        return NullGpuBackend(), f"GPU telemetry off: {e}; running CPU-only"
    return backend, f"GPU telemetry from NVML ({backend.device_count} GPUs)"
