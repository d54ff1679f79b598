"""The sidecar's GPU half: backends behind one small interface, and the GPU agent.

backend.py   the GpuBackend interface, readings, errors, the null backend
nvml.py      the NVML adapter (pynvml)
node_backend.py  the pod's GPUs as the node agent serves them (throttledjob node)
fake.py      simulated GPUs (tests, demos, `--gpu-backend fake`)
simulate.py  what feeds simulated GPUs: a test harness, or a live run's GPU agent
agent.py     one GPU control cycle: read, keep peaks, decide a duty, the power-limit lever
controller.py, explorer.py   the duty control law and the power-limit explorer (pure)

`open_backend` lives here rather than in backend.py so that the backends depend on the
interface and only this package entry depends on them (no import circle).
"""

from __future__ import annotations

import os
from pathlib import Path

from throttledjob.contracts.names import ENV_NODE_SOCKET, GPU_BACKENDS, NODE_SOCKET
from throttledjob.contracts.policy import Policy

from .agent import GpuAgent, GpuState
from .backend import THROTTLE_REASONS, GpuBackend, GpuError, GpuReading, NullGpuBackend, select_gpus

__all__ = ["BACKENDS", "THROTTLE_REASONS", "GpuAgent", "GpuBackend", "GpuError", "GpuReading",
           "GpuState", "NullGpuBackend", "open_backend", "open_gpu_agent", "select_gpus"]

BACKENDS = GPU_BACKENDS


def open_backend(name: str, environ: dict[str, str] | None = None) -> tuple[GpuBackend, str]:
    """The backend for `--gpu-backend name` and a one-line note on what was chosen.

    "auto" takes the node agent where its socket is there (a pod on a node that runs it),
    and falls back to none when NVML is missing (the common case off a GPU node); an
    explicit "nvml" that cannot load raises GpuError so that a misconfiguration is loud.
    Simulated GPUs see no workload until a GPU agent drives them (`simulate.follow`).
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


def open_gpu_agent(backend: str, policy: Policy) -> GpuAgent:
    """The GPU agent both hosts run (the pod's sidecar, local mode): the backend named
    by `--gpu-backend` (open_backend; its note is the agent's `note`), and simulated GPUs
    made to see what the agent does to the workload. Raises GpuError."""
    from .simulate import follow

    opened, note = open_backend(backend)
    agent = GpuAgent(opened, policy, note=note)
    follow(agent)
    return agent
