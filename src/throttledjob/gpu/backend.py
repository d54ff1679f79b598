"""GPUs behind one small interface: readings in base units, one error type.

Neither the sidecar nor the node agent calls NVML directly: the NVML adapter (gpu/nvml.py),
the simulated set (gpu/fake.py), the node agent's client (gpu/node_backend.py) and the null
backend below implement this interface, so the control loop has one code path;
`open_backend` (gpu/__init__.py) picks one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

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

    def as_json(self) -> dict:
        """The reading as the node agent sends it (gpu/node_backend.py)."""
        doc = {k: getattr(self, k) for k in self.__dataclass_fields__}
        doc["throttle_reasons"] = sorted(self.throttle_reasons)
        doc["process_memory_bytes"] = {str(k): v for k, v in self.process_memory_bytes.items()}
        return doc

    @classmethod
    def from_json(cls, doc: dict) -> GpuReading:
        """The reading back from `as_json`; GpuError where the document is not one."""
        try:
            fields = {k: doc[k] for k in cls.__dataclass_fields__ if k in doc}
            fields["throttle_reasons"] = frozenset(doc.get("throttle_reasons") or ())
            fields["process_memory_bytes"] = {
                int(k): int(v) for k, v in (doc.get("process_memory_bytes") or {}).items()}
            return cls(**fields)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise GpuError(f"a GPU reading that is not one: {e}") from None


class GpuBackend(ABC):
    """What the sidecar and the node agent need from a GPU library. Every method may
    raise GpuError."""

    #: "nvml", "fake" or "none": shown in /status and metrics.
    kind: str = "none"
    #: True for readings that do not come from hardware.
    simulated: bool = False
    #: True where an unreachable backend comes back on its own (the node agent, a
    #: process the kubelet restarts): lost, it is asked again every few seconds, not dropped.
    recovers: bool = False
    #: True where the backend keeps each GPU's limit from before the first cap and puts it
    #: back itself (the node agent, which outlives the sidecar): a caller lifts a cap with
    #: `restore_power_limit`, never by writing back a limit it read, which a caller
    #: restarted mid-cap would have read capped.
    keeps_originals: bool = False

    @abstractmethod
    def read(self) -> list[GpuReading]:
        """A reading of every GPU this backend sees."""

    def read_as(self, reader: str) -> list[GpuReading]:
        """read(), for one of several readers of the same GPUs (the node agent's pods, its
        scrape): a figure averaged since the last read (NVML's utilization) is averaged
        since this reader's last read, not anyone's."""
        return self.read()

    def power_limit_range_watts(self, index: int) -> tuple[float, float] | None:
        """(min, max) power limit the device accepts, or None when it has no such lever."""
        return None

    def power_management_limit_watts(self, index: int) -> float | None:
        """The limit set on the board: what `set_power_limit_watts` sets, and so what is
        kept to be put back. A reading's `power_limit_watts` is the limit enforced, which
        out-of-band limiters (the BMC's) may hold lower. None: no such lever."""
        return None

    def index_of(self, uuid: str) -> int | None:
        """The index of the GPU `uuid` (None: not on this node any more). GpuError, lost,
        where that GPU has fallen off the bus."""
        return next((r.index for r in self.read() if r.uuid == uuid), None)

    def set_power_limit_watts(self, index: int, watts: float) -> None:
        raise GpuError(f"{self.kind}: GPU power limit is not supported")

    def original_power_limit_watts(self, index: int) -> float | None:
        """Where the backend `keeps_originals`: the limit the GPU had before the first cap,
        the one it gets back."""
        raise GpuError(f"{self.kind}: keeps no original power limit")

    def restore_power_limit(self, index: int) -> None:
        """Where the backend `keeps_originals`: the GPU back to its original limit (nothing
        to do where it is not capped)."""
        raise GpuError(f"{self.kind}: keeps no original power limit")

    def close(self) -> None:
        """Release the library; safe to call twice."""
        return None


class NullGpuBackend(GpuBackend):
    """No GPU telemetry: the sidecar runs CPU-only."""

    def read(self) -> list[GpuReading]:
        return []


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
