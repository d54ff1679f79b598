"""The NVML backend: a thin adapter from pynvml (nvidia-ml-py) to GpuBackend.

Only unit conversion, error translation and a GPU off the bus left out of reads live
here (tested against a patched pynvml); there is no other logic, which is why the fake
backend can stand in for it everywhere else.
NVML units: power in milliwatts, clocks in MHz, memory in bytes, utilization in percent.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from .backend import GpuBackend, GpuError, GpuReading

T = TypeVar("T")
log = logging.getLogger("throttledjob.gpu")
# Readers whose cursor into NVML's utilization samples is kept (the node agent's pods).
MAX_READERS = 256


def _translate(fn: Callable[..., T]) -> Callable[..., T]:
    """Turn every pynvml error into GpuError, marking the ones that will not heal."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            pynvml = sys.modules.get("pynvml")
            if pynvml is None or not isinstance(e, pynvml.NVMLError):
                raise
            lost = isinstance(e, (pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_LibraryNotFound,
                                  pynvml.NVMLError_Uninitialized))
            raise GpuError(f"NVML: {e}", lost=lost) from None

    return wrapper


class NvmlBackend(GpuBackend):
    kind = "nvml"

    @_translate
    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError:
            raise GpuError("the nvidia-ml-py package is not installed", lost=True) from None
        self._nvml = pynvml
        pynvml.nvmlInit()  # NVMLError_LibraryNotFound without a driver
        self._open = True
        self._memory_v2 = True   # until the driver says it has no such struct
        self._samples = True     # until the driver says it keeps no utilization samples
        self.device_count = pynvml.nvmlDeviceGetCount()
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.device_count)]
        # Per reader, per GPU: the newest utilization sample it has read (NVML's
        # microseconds). The oldest reader is forgotten past MAX_READERS (pods gone).
        self._seen: collections.OrderedDict[str, list[int]] = collections.OrderedDict()
        self._lost: set[int] = set()   # GPUs found off the bus (said once each)

    def read(self) -> list[GpuReading]:
        return self.read_as("")

    @_translate
    def read_as(self, reader: str) -> list[GpuReading]:
        # One agent serves every pod of a node: with one cursor, a pod's read covered
        # only the time since any pod's read (1/8 of its interval with 8 pods reading).
        seen = self._seen.pop(reader, None) or [0] * self.device_count
        self._seen[reader] = seen
        while len(self._seen) > MAX_READERS:
            self._seen.popitem(last=False)
        readings, lost = [], None
        for i, h in enumerate(self._handles):
            try:
                readings.append(self._read_one(i, h, seen))
            except self._nvml.NVMLError_GpuIsLost as e:
                # One board off the bus must not blind the node agent to the others (nor
                # stop their restores): it is left out. All of them lost: the GPUs are.
                lost = e
                if i not in self._lost:
                    self._lost.add(i)
                    log.warning("throttledjob: GPU %d has fallen off the bus: left out of "
                                "the readings", i)
        if lost is not None and not readings:
            raise lost
        return readings

    def _read_one(self, index: int, h: Any, seen: list[int]) -> GpuReading:
        n = self._nvml
        mem = self._memory(h)
        return GpuReading(
            index=index, uuid=n.nvmlDeviceGetUUID(h), name=n.nvmlDeviceGetName(h),
            utilization_ratio=self._utilization(index, h, seen),
            memory_used_bytes=int(mem.used), memory_total_bytes=int(mem.total),
            power_watts=self._optional(lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0),
            power_limit_watts=self._optional(
                lambda: n.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0),
            temperature_celsius=self._optional(
                lambda: float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))),
            sm_clock_hertz=self._optional(
                lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM) * 1e6),
            throttle_reasons=self._reasons(h),
            process_memory_bytes=self._processes(h),
        )

    def _utilization(self, index: int, h: Any, seen: list[int]) -> float:
        """The share of time a kernel ran since the reader's last read (`seen`: its
        newest sample of each GPU): the mean of the samples the driver kept since then
        (one per its sample period, 1/6 s to 1 s by board).
        nvmlDeviceGetUtilizationRates gives only the last period's, which over a 1-second
        interval of pauses and bursts reads whichever the period fell on. The first read
        takes the last second's samples; no new sample, or none kept: the last period's."""
        n = self._nvml
        if self._samples:
            try:
                _, samples = n.nvmlDeviceGetSamples(h, n.NVML_GPU_UTILIZATION_SAMPLES,
                                                    seen[index])
            except n.NVMLError_NotFound:    # no sample since the last read
                samples = []
            except (AttributeError, n.NVMLError_FunctionNotFound, n.NVMLError_NotSupported):
                self._samples, samples = False, []
            if samples:
                newest = max(s.timeStamp for s in samples)
                since = seen[index] or newest - 1_000_000
                recent = [s.sampleValue.uiVal for s in samples if s.timeStamp >= since]
                seen[index] = newest
                return sum(recent) / len(recent) / 100.0
        return n.nvmlDeviceGetUtilizationRates(h).gpu / 100.0

    def _memory(self, h: Any) -> Any:
        """Memory as nvidia-smi and dcgm-exporter read it: the v2 struct, whose `used`
        leaves out what the driver reserves (v1 counted it: 1,587 MiB against
        nvidia-smi's 973 MiB on an H200). v1 where the driver or pynvml lacks v2."""
        n = self._nvml
        if self._memory_v2:
            try:
                return n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
            except (TypeError, AttributeError, n.NVMLError_FunctionNotFound,
                    n.NVMLError_NotSupported, n.NVMLError_ArgumentVersionMismatch):
                self._memory_v2 = False
        return n.nvmlDeviceGetMemoryInfo(h)

    def _optional(self, read: Callable[[], T]) -> T | None:
        # Consumer boards lack some counters (NVML_ERROR_NOT_SUPPORTED): drop the series.
        try:
            return read()
        except self._nvml.NVMLError_NotSupported:
            return None

    def _reasons(self, h: Any) -> frozenset[str]:
        n = self._nvml
        try:
            mask = n.nvmlDeviceGetCurrentClocksEventReasons(h)
        except n.NVMLError_NotSupported:
            return frozenset()
        bits = {"gpu_idle": n.nvmlClocksEventReasonGpuIdle,
                "sw_power_cap": n.nvmlClocksEventReasonSwPowerCap,
                "hw_slowdown": n.nvmlClocksEventReasonHwSlowdown,
                "sw_thermal": n.nvmlClocksEventReasonSwThermalSlowdown,
                "hw_thermal": n.nvmlClocksEventReasonHwThermalSlowdown,
                "hw_power_brake": n.nvmlClocksEventReasonHwPowerBrakeSlowdown}
        return frozenset(name for name, bit in bits.items() if mask & bit)

    def _processes(self, h: Any) -> dict[int, int]:
        n = self._nvml
        try:
            procs = n.nvmlDeviceGetComputeRunningProcesses(h)
        except (n.NVMLError_NotSupported, n.NVMLError_NoPermission):
            return {}
        # usedGpuMemory is None when the driver cannot attribute memory (e.g. under MIG).
        return {int(p.pid): int(p.usedGpuMemory) for p in procs if p.usedGpuMemory is not None}

    @_translate
    def power_limit_range_watts(self, index: int) -> tuple[float, float] | None:
        low, high = self._nvml.nvmlDeviceGetPowerManagementLimitConstraints(self._handles[index])
        return low / 1000.0, high / 1000.0

    @_translate
    def power_management_limit_watts(self, index: int) -> float | None:
        # Not the enforced limit of a reading: that one counts out-of-band limiters (the
        # BMC's), and written back as the board's own it would keep their cut for good.
        h = self._handles[index]
        return self._optional(lambda: self._nvml.nvmlDeviceGetPowerManagementLimit(h) / 1000.0)

    @_translate
    def index_of(self, uuid: str) -> int | None:
        # One GPU looked up, not all of them read: another board lost changes nothing here.
        n = self._nvml
        try:
            index = n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(uuid))
        except n.NVMLError_NotFound:
            return None
        return index if 0 <= index < len(self._handles) else None

    @_translate
    def set_power_limit_watts(self, index: int, watts: float) -> None:
        # Needs root on the node or CAP_SYS_ADMIN: opt-in, see docs/sidecar.md.
        self._nvml.nvmlDeviceSetPowerManagementLimit(self._handles[index], int(watts * 1000))

    def close(self) -> None:
        if getattr(self, "_open", False):
            self._open = False
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()
