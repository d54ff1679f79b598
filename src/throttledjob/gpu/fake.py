"""Simulated GPUs for tests, demos and dashboards on machines without one.

Deterministic: time is the number of reads (one per control interval), so a trace
replays the same way at any interval. The model is rough but has the shape of a real
GPU fed by a host process:
- utilization = the trace's demand x the fraction of time the workload was not held
  back (a paused or paced feeder launches no kernels);
- power = idle + (TDP - idle) x utilization x clock^2 (dynamic power ~ C V^2 f, the
  voltage following the clock part of the way). Under a power limit the SM clock drops
  until the power fits and `sw_power_cap` is raised, while utilization stays where it
  was (kernels run longer at lower clocks, as on real boards);
- the work done (`speed`) = the time not held back x clock^sensitivity: 1 for a
  compute-bound kernel mix, near 0 for a memory-bound one;
- temperature follows power with a lag; memory follows demand, capped by the memory
  fraction the workload was told to use.

Environment (for `--gpu-backend fake`): THROTTLEDJOB_FAKE_GPUS (count, default 1),
THROTTLEDJOB_FAKE_GPU_TRACE (steady, plateau, spike, sawtooth, idle; default plateau),
THROTTLEDJOB_FAKE_GPU_FAIL_AFTER (reads before the GPUs fall off the bus; default never),
THROTTLEDJOB_FAKE_GPU_START (`now`, the default: busy from the first read; `first-step`:
idle until the workload reports its first step, as a real board idles through a job's
imports and loading until its feeder launches kernels), THROTTLEDJOB_FAKE_GPU_LIMITS_FILE
(the boards' power limits kept in this JSON file: a real board's limit outlives the
process that set it, so an agent killed and started again finds its cap in force).

What the workload does to its GPUs (held back, memory fraction) is not part of the GpuBackend
interface, which the NVML adapter implements against hardware that sees it for itself: the
fake reads it from `load`, a constructor argument. A harness feeds it (`feed`, `drive` in
sidecar/gpu_simulate.py); a live run lets it follow the GPU agent (`gpu_simulate.follow`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from throttledjob.runtime.files import write_json_atomic

from .backend import GpuBackend, GpuError, GpuReading

IDLE_WATTS = 60.0
TDP_WATTS = 300.0
MIN_LIMIT_WATTS = 100.0
# Dynamic power grows with the SM clock to this power (see the module doc).
POWER_CLOCK_EXPONENT = 2.0
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


@dataclass(frozen=True)
class SimulatedLoad:
    """What the workload does to its GPUs over the interval a read reports."""

    hold_back: float = 0.0                # fraction of the interval it was held back
    memory_fraction: float | None = None  # GPU memory share it was told to use
    stepped: bool = True                  # it has reported a step (or reports none)


class FakeGpuBackend(GpuBackend):
    kind = "fake"
    simulated = True

    def __init__(self, count: int = 1, trace: str | Callable[[int], float] = "plateau",
                 fail_after: int | None = None, clock_sensitivity: float = 1.0,
                 load: Callable[[], SimulatedLoad] | None = None,
                 idle_until_first_step: bool = False, limits_file: str | None = None) -> None:
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
        self.idle_until_first_step = idle_until_first_step
        self.reads = 0
        self._fed = SimulatedLoad()
        # Asked once per read: the simulated workload's state over the interval it reports.
        self.load: Callable[[], SimulatedLoad] = load or (lambda: self._fed)
        self.limits = [TDP_WATTS] * count   # each board's management limit (ours to set)
        self.limits_file = limits_file
        if limits_file:
            try:
                with open(limits_file) as f:
                    self.limits = [float(w) for w in json.load(f)][:count]
                self.limits += [TDP_WATTS] * (count - len(self.limits))
            except FileNotFoundError:
                pass
        # A limiter outside the driver (the BMC's, a rack's power budget): the limit
        # enforced, which a reading reports and the clock follows, is the lower of the two.
        self.out_of_band_limits: list[float | None] = [None] * count
        self.clock_sensitivity = clock_sensitivity
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
        start = env.get("THROTTLEDJOB_FAKE_GPU_START", "now")
        if start not in ("now", "first-step"):
            raise GpuError(f"bad fake GPU setting: THROTTLEDJOB_FAKE_GPU_START={start!r} "
                           "(choose now or first-step)")
        return cls(count, env.get("THROTTLEDJOB_FAKE_GPU_TRACE", "plateau"), fail_after,
                   idle_until_first_step=start == "first-step",
                   limits_file=env.get("THROTTLEDJOB_FAKE_GPU_LIMITS_FILE") or None)

    def describe(self) -> str:
        return f"{self.count} fake GPU(s), trace {self.trace_name}"

    def feed(self, hold_back: float, memory_fraction: float | None = None) -> None:
        """For a harness with the default `load`: the workload's state from now on."""
        self._fed = SimulatedLoad(hold_back, memory_fraction)

    def read(self) -> list[GpuReading]:
        if self.fail_after is not None and self.reads >= self.fail_after:
            raise GpuError("fake GPU has fallen off the bus", lost=True)
        load = self.load()
        t = self.reads
        self.reads += 1
        idle = self.idle_until_first_step and not load.stepped
        return [self._reading(i, t, _hold_back(load), load.memory_fraction, idle)
                for i in range(self.count)]

    def _reading(self, i: int, t: int, hold_back: float,
                 memory_fraction: float | None, idle: bool = False) -> GpuReading:
        demand = 0.0 if idle else self._demand(i, t)
        util = demand * (1.0 - hold_back)
        clock = self._clock(i, util)
        capped = clock < 1.0
        watts = IDLE_WATTS + (TDP_WATTS - IDLE_WATTS) * util * clock ** POWER_CLOCK_EXPONENT
        self._temps[i] += 0.3 * (AMBIENT_CELSIUS + 0.15 * watts - self._temps[i])
        cap = memory_fraction or 1.0
        used = int(MEMORY_BYTES * min(cap, 0.1 + 0.6 * demand))
        reasons = {"sw_power_cap"} if capped else ({"gpu_idle"} if util < 0.01 else set())
        return GpuReading(
            index=i, uuid=fake_uuid(i), name="Simulated GPU",
            utilization_ratio=round(util, 4), memory_used_bytes=used,
            memory_total_bytes=MEMORY_BYTES, power_watts=round(watts, 2),
            power_limit_watts=self.enforced_limit(i), temperature_celsius=round(self._temps[i], 2),
            sm_clock_hertz=round(MAX_SM_CLOCK_HERTZ * clock), throttle_reasons=frozenset(reasons),
            process_memory_bytes={},
        )

    def _demand(self, i: int, t: int) -> float:
        # Each GPU a little lighter than the one before: per-GPU series stay distinguishable.
        return min(1.0, max(0.0, self.trace(t) - 0.01 * i))

    def _clock(self, i: int, util: float) -> float:
        return clock_within(self.enforced_limit(i), util)

    def enforced_limit(self, i: int) -> float:
        oob = self.out_of_band_limits[i]
        return self.limits[i] if oob is None else min(self.limits[i], oob)

    def speed(self, index: int = 0) -> float:
        """The work the interval now running does (the next read reports it), as a
        fraction of the unthrottled rate: under the hold-back and limit in force now."""
        hold_back = _hold_back(self.load())
        util = self._demand(index, self.reads) * (1.0 - hold_back)
        return (1.0 - hold_back) * self._clock(index, util) ** self.clock_sensitivity

    def power_limit_range_watts(self, index: int) -> tuple[float, float]:
        return MIN_LIMIT_WATTS, TDP_WATTS

    def power_management_limit_watts(self, index: int) -> float:
        return self.limits[index]

    def index_of(self, uuid: str) -> int | None:
        # Not through read(): a read is a step of the simulation's time.
        return next((i for i in range(self.count) if fake_uuid(i) == uuid), None)

    def set_power_limit_watts(self, index: int, watts: float) -> None:
        if not MIN_LIMIT_WATTS <= watts <= TDP_WATTS:
            raise GpuError(f"power limit {watts} W outside [{MIN_LIMIT_WATTS}, {TDP_WATTS}]")
        self.limits[index] = watts
        self.limit_calls.append((index, watts))
        if self.limits_file:
            write_json_atomic(self.limits_file, self.limits)


def clock_within(limit_watts: float, util: float) -> float:
    """The SM clock, as a fraction of the maximum, at which a board this busy draws no
    more than `limit_watts` (the model's power law)."""
    dynamic = (TDP_WATTS - IDLE_WATTS) * util
    if IDLE_WATTS + dynamic <= limit_watts + 1e-9:
        return 1.0
    return ((limit_watts - IDLE_WATTS) / dynamic) ** (1 / POWER_CLOCK_EXPONENT)


def fake_uuid(index: int) -> str:
    """Simulated GPU `index`'s UUID: the test cluster's fake device plugin advertises the
    same, so that the node agent's simulated board is keyed as the kubelet allocates."""
    return f"GPU-fake0000-0000-0000-0000-{index:012d}"


def _hold_back(load: SimulatedLoad) -> float:
    return min(1.0, max(0.0, load.hold_back))
