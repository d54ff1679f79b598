"""Simulated GPUs for tests, demos and dashboards on machines without one.

Deterministic: time is the number of reads (one per control interval), so a trace
replays the same way at any interval. The model is rough but has the shape of a real
GPU fed by a host process:
- utilization = the trace's demand x the fraction of time the workload was not held
  back (a paused or paced feeder launches no kernels);
- power = idle + (TDP - idle) x utilization, clipped by the power limit; when clipped,
  the SM clock drops in proportion and `sw_power_cap` is raised, while utilization
  stays where it was (kernels run longer at lower clocks, as on real boards);
- temperature follows power with a lag; memory follows demand, capped by the memory
  fraction the workload was told to use.

Environment (for `--gpu-backend fake`): THROTTLEDJOB_FAKE_GPUS (count, default 1),
THROTTLEDJOB_FAKE_GPU_TRACE (steady, plateau, spike, sawtooth, idle; default plateau),
THROTTLEDJOB_FAKE_GPU_FAIL_AFTER (reads before the GPUs fall off the bus; default never).
"""

from __future__ import annotations

from collections.abc import Callable

from .gpu import GpuBackend, GpuError, GpuReading

IDLE_WATTS = 60.0
TDP_WATTS = 300.0
MIN_LIMIT_WATTS = 100.0
MAX_SM_CLOCK_HERTZ = 1.41e9
MEMORY_BYTES = 40 * 1024**3
AMBIENT_CELSIUS = 30.0


def _steady(t: int) -> float:
    return 0.95


def _plateau(t: int) -> float:
    # Warm-up (data loading), then a long compute-bound plateau.
    return 0.3 if t < 5 else 0.95


def _spike(t: int) -> float:
    # A light baseline with a 3-sample burst every 20 samples (an evaluation pass).
    return 1.0 if t % 20 in (10, 11, 12) else 0.3


def _sawtooth(t: int) -> float:
    # Ramps from 20% to 100% over 10 samples, then drops (a growing then reset batch).
    return 0.2 + 0.8 * (t % 10) / 9


def _idle(t: int) -> float:
    return 0.05


TRACES: dict[str, Callable[[int], float]] = {
    "steady": _steady, "plateau": _plateau, "spike": _spike, "sawtooth": _sawtooth,
    "idle": _idle,
}


class FakeGpuBackend(GpuBackend):
    kind = "fake"
    simulated = True

    def __init__(self, count: int = 1, trace: str | Callable[[int], float] = "plateau",
                 fail_after: int | None = None) -> None:
        if not 1 <= count <= 64:
            raise GpuError(f"fake GPU count must be between 1 and 64, got {count}")
        if isinstance(trace, str):
            if trace not in TRACES:
                raise GpuError(f"unknown fake GPU trace {trace!r} "
                               f"(choose from {', '.join(TRACES)})")
            self.trace_name, self.trace = trace, TRACES[trace]
        else:
            self.trace_name, self.trace = getattr(trace, "__name__", "custom"), trace
        self.count = count
        self.fail_after = fail_after
        self.reads = 0
        self.pause_fraction = 0.0
        self.memory_fraction: float | None = None
        self.limits = [TDP_WATTS] * count
        self._temps = [AMBIENT_CELSIUS + 10.0] * count
        self.limit_calls: list[tuple[int, float]] = []

    @classmethod
    def from_environ(cls, env: dict[str, str]) -> FakeGpuBackend:
        try:
            count = int(env.get("THROTTLEDJOB_FAKE_GPUS", "1"))
            fail = env.get("THROTTLEDJOB_FAKE_GPU_FAIL_AFTER")
            fail_after = int(fail) if fail else None
        except ValueError as e:
            raise GpuError(f"bad fake GPU setting: {e}") from None
        return cls(count, env.get("THROTTLEDJOB_FAKE_GPU_TRACE", "plateau"), fail_after)

    def describe(self) -> str:
        return f"{self.count} fake GPU(s), trace {self.trace_name}"

    def observe_pause(self, pause_fraction: float) -> None:
        self.pause_fraction = min(1.0, max(0.0, pause_fraction))

    def read(self) -> list[GpuReading]:
        if self.fail_after is not None and self.reads >= self.fail_after:
            raise GpuError("fake GPU has fallen off the bus", lost=True)
        t = self.reads
        self.reads += 1
        return [self._reading(i, t) for i in range(self.count)]

    def _reading(self, i: int, t: int) -> GpuReading:
        # Each GPU a little lighter than the one before: per-GPU series stay distinguishable.
        demand = min(1.0, max(0.0, self.trace(t) - 0.01 * i))
        util = demand * (1.0 - self.pause_fraction)
        wanted_watts = IDLE_WATTS + (TDP_WATTS - IDLE_WATTS) * util
        watts = min(wanted_watts, self.limits[i])
        capped = wanted_watts > self.limits[i] + 1e-9
        clock = MAX_SM_CLOCK_HERTZ * (watts / wanted_watts if capped else 1.0)
        self._temps[i] += 0.3 * (AMBIENT_CELSIUS + 0.15 * watts - self._temps[i])
        cap = self.memory_fraction or 1.0
        used = int(MEMORY_BYTES * min(cap, 0.1 + 0.6 * demand))
        reasons = {"sw_power_cap"} if capped else ({"gpu_idle"} if util < 0.01 else set())
        return GpuReading(
            index=i, uuid=f"GPU-fake0000-0000-0000-0000-{i:012d}", name="Simulated GPU",
            utilization_ratio=round(util, 4), memory_used_bytes=used,
            memory_total_bytes=MEMORY_BYTES, power_watts=round(watts, 2),
            power_limit_watts=self.limits[i], temperature_celsius=round(self._temps[i], 2),
            sm_clock_hertz=round(clock), throttle_reasons=frozenset(reasons),
            process_memory_bytes={},
        )

    def power_limit_range_watts(self, index: int) -> tuple[float, float]:
        return MIN_LIMIT_WATTS, TDP_WATTS

    def set_power_limit_watts(self, index: int, watts: float) -> None:
        if not MIN_LIMIT_WATTS <= watts <= TDP_WATTS:
            raise GpuError(f"power limit {watts} W outside [{MIN_LIMIT_WATTS}, {TDP_WATTS}]")
        self.limits[index] = watts
        self.limit_calls.append((index, watts))
