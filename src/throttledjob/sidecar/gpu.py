"""GPUs behind one small interface: readings in base units, one error type, a factory.

The sidecar never calls NVML directly: `open_backend("auto")` returns the NVML adapter
(sidecar/nvml.py) when the library loads, the simulated set (sidecar/fakegpu.py) when
asked for, and a null backend otherwise, so the control loop has one code path.
"""

from __future__ import annotations

import logging
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

log = logging.getLogger("throttledjob.sidecar")
BACKENDS = ("auto", "nvml", "fake", "none")
# Clock event ("throttle") reasons, named as dcgm-exporter and nvidia-smi name them.
THROTTLE_REASONS = ("gpu_idle", "sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal",
                    "hw_power_brake")


class GpuError(RuntimeError):
    """A GPU read or write failed; `lost` when the device (or the library) is gone for good."""

    def __init__(self, message: str, lost: bool = False) -> None:
        super().__init__(message)
        self.lost = lost


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one instant, in base units (ratios 0..1, bytes, watts, hertz, celsius).

    Fields a device cannot report are None; the exporter then drops that series.
    """

    index: int
    uuid: str
    name: str
    utilization_ratio: float
    memory_used_bytes: int
    memory_total_bytes: int
    power_watts: float | None = None
    power_limit_watts: float | None = None
    temperature_celsius: float | None = None
    sm_clock_hertz: float | None = None
    throttle_reasons: frozenset[str] = frozenset()
    # pid -> bytes of GPU memory, where the driver can tell (not under MIG or in containers
    # that cannot see the host pid namespace).
    process_memory_bytes: dict[int, int] = field(default_factory=dict)


class GpuBackend(ABC):
    """What the sidecar needs from a GPU library. Every method may raise GpuError."""

    #: "nvml", "fake" or "none": shown in /status and metrics.
    kind: str = "none"
    #: True for readings that do not come from hardware.
    simulated: bool = False

    @abstractmethod
    def read(self) -> list[GpuReading]:
        """A reading of every GPU this backend sees."""

    def power_limit_range_watts(self, index: int) -> tuple[float, float] | None:
        """(min, max) power limit the device accepts, or None when it has no such lever."""
        return None

    def set_power_limit_watts(self, index: int, watts: float) -> None:
        raise GpuError(f"{self.kind}: GPU power limit is not supported")

    def observe_pause(self, pause_fraction: float) -> None:
        """The fraction of the last interval the workload was held back (for simulators)."""
        return None

    def close(self) -> None:
        """Release the library; safe to call twice."""
        return None


class NullGpuBackend(GpuBackend):
    """No GPU telemetry: the sidecar runs CPU-only."""

    def read(self) -> list[GpuReading]:
        return []


def open_backend(name: str, environ: dict[str, str] | None = None) -> tuple[GpuBackend, str]:
    """The backend for `--gpu-backend name` and a one-line note on what was chosen.

    "auto" falls back to none when NVML is missing (the common case off a GPU node); an
    explicit "nvml" that cannot load raises GpuError so that a misconfiguration is loud.
    """
    env = os.environ if environ is None else environ
    if name not in BACKENDS:
        raise GpuError(f"unknown GPU backend {name!r} (choose from {', '.join(BACKENDS)})")
    if name == "none":
        return NullGpuBackend(), "GPU telemetry off (--gpu-backend none)"
    if name == "fake":
        from .fakegpu import FakeGpuBackend

        backend = FakeGpuBackend.from_environ(env)
        return backend, f"GPU telemetry simulated: {backend.describe()}"
    from .nvml import NvmlBackend

    try:
        backend = NvmlBackend()
    except GpuError as e:
        if name == "nvml":
            raise
        return NullGpuBackend(), f"GPU telemetry off: {e}; running CPU-only"
    return backend, f"GPU telemetry from NVML ({backend.device_count} GPUs)"


def select_gpus(readings: list[GpuReading], visible: list[str]) -> list[GpuReading]:
    """The GPUs the workload uses, from the ids or UUIDs it declared (progress files).

    Nothing declared: every GPU the backend sees (the sidecar container of a pod is only
    given the pod's GPUs). An id that matches nothing is ignored rather than widening
    the watch to the whole node.
    """
    if not visible:
        return readings
    wanted = {v.strip().lower() for v in visible}
    chosen = [r for r in readings
              if str(r.index) in wanted or r.uuid.lower() in wanted
              or any(r.uuid.lower().startswith(w) for w in wanted if w.startswith("gpu-"))]
    return chosen
