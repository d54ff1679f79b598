"""GPU backends: the factory, the simulator's physics, the thin NVML adapter, degradation."""

from __future__ import annotations

import statistics
import types

import pynvml
import pytest

from throttledjob.contracts.policy import Policy
from throttledjob.gpu import GpuError, GpuReading, NullGpuBackend, open_backend, select_gpus
from throttledjob.gpu.fake import IDLE_WATTS, MEMORY_BYTES, FakeGpuBackend
from throttledjob.gpu.nvml import NvmlBackend
from throttledjob.sidecar.gpu_agent import GpuAgent
from throttledjob.sidecar.gpu_controller import DEFAULT_MARGIN
from throttledjob.sidecar.gpu_simulate import drive, follow


def test_auto_without_nvml_library_runs_cpu_only_and_says_why():
    # This machine has no NVIDIA driver: nvmlInit raises NVMLError_LibraryNotFound.
    backend, note = open_backend("auto", {})
    assert isinstance(backend, NullGpuBackend)
    assert "CPU-only" in note and "NVML" in note


def test_explicit_nvml_without_library_is_an_error():
    with pytest.raises(GpuError) as e:
        open_backend("nvml", {})
    assert e.value.lost


def test_fake_backend_from_environment():
    backend, note = open_backend("fake", {"THROTTLEDJOB_FAKE_GPUS": "8",
                                          "THROTTLEDJOB_FAKE_GPU_TRACE": "steady"})
    readings = backend.read()
    assert len(readings) == 8 and backend.simulated
    assert "8 fake GPU(s)" in note
    assert len({r.uuid for r in readings}) == 8


@pytest.mark.parametrize("env", [{"THROTTLEDJOB_FAKE_GPUS": "0"},
                                 {"THROTTLEDJOB_FAKE_GPUS": "x"},
                                 {"THROTTLEDJOB_FAKE_GPU_TRACE": "nope"},
                                 {"THROTTLEDJOB_FAKE_GPU_START": "later"}])
def test_bad_fake_settings_are_refused(env):
    with pytest.raises(GpuError):
        open_backend("fake", env)


def test_simulated_gpu_responds_to_hold_back_and_power_limit():
    gpu = FakeGpuBackend(1, "steady")
    free = gpu.read()[0]
    gpu.feed(hold_back=0.5)
    held = gpu.read()[0]
    assert held.utilization_ratio == pytest.approx(free.utilization_ratio / 2)
    assert held.power_watts < free.power_watts
    gpu.feed(hold_back=0.0)
    gpu.set_power_limit_watts(0, 150.0)
    capped = gpu.read()[0]
    # Like a real board: power clipped, clocks down, utilization unchanged, reason raised.
    assert capped.power_watts == 150.0
    assert capped.sm_clock_hertz < free.sm_clock_hertz
    assert capped.utilization_ratio == free.utilization_ratio
    assert "sw_power_cap" in capped.throttle_reasons


def test_in_a_live_run_simulated_gpus_follow_the_gpu_agent():
    # What the GPU agent does to the workload reaches the simulator without any hook in
    # the backend interface the NVML adapter implements.
    gpu = FakeGpuBackend(1, "steady")
    agent = GpuAgent(gpu, Policy(gpu_memory_fraction=0.2))
    follow(agent)
    agent.cycle(1.0, 0.0, [])
    free = agent.readings[0]
    agent.cycle(1.0, 0.5, [])
    held = agent.readings[0]
    assert held.utilization_ratio == pytest.approx(free.utilization_ratio / 2)
    assert free.memory_used_bytes == int(0.2 * MEMORY_BYTES)
    agent.set_policy(Policy())
    agent.cycle(1.0, 0.0, [])
    assert agent.readings[0].memory_used_bytes > free.memory_used_bytes


def test_a_simulated_board_can_idle_until_the_workloads_first_step():
    """THROTTLEDJOB_FAKE_GPU_START=first-step: idle through the job's imports (no step
    reported yet), busy from the interval in which the first step came."""
    gpu, _ = open_backend("fake", {"THROTTLEDJOB_FAKE_GPU_TRACE": "steady",
                                   "THROTTLEDJOB_FAKE_GPU_START": "first-step"})
    agent = GpuAgent(gpu, Policy())
    follow(agent)
    read = []
    for steps in (0, 0, 3, 0):
        agent.cycle(1.0, 0.0, [], steps=steps)
        read.append((agent.readings[0].utilization_ratio, agent.readings[0].power_watts))
    assert read[:2] == [(0.0, IDLE_WATTS)] * 2
    assert read[2] == read[3] and read[2][0] == pytest.approx(0.95)


def test_the_agent_reads_the_floor_while_the_gpu_idles_and_then_holds_power_at_target():
    """A job whose first seconds leave the GPU idle (imports, loading): the agent reads the
    board's idle draw, and once the work starts, each interval after the first is within
    5% under the target and their mean within 5% under the setpoint."""
    gpu = FakeGpuBackend(1, lambda t: 0.0 if t < 3 else 0.95)
    agent = GpuAgent(gpu, Policy(gpu_peak_power_watts=200.0, max_slowdown=3.0))
    rows = drive(agent, gpu, 40)
    assert agent.floor_watts == IDLE_WATTS
    held = [r.power_watts for r in rows[4:]]
    assert all(200.0 * 0.95 <= p <= 200.0 for p in held), held
    setpoint = 200.0 * (1 - DEFAULT_MARGIN)
    assert 0.95 * setpoint <= statistics.fmean(held) <= setpoint


def test_select_gpus_by_index_or_uuid():
    readings = FakeGpuBackend(4, "steady").read()
    assert [r.index for r in select_gpus(readings, [])] == [0, 1, 2, 3]
    assert [r.index for r in select_gpus(readings, ["1", "3"])] == [1, 3]
    assert [r.index for r in select_gpus(readings, [readings[2].uuid])] == [2]
    assert select_gpus(readings, ["7"]) == []  # never widens to every GPU on the node


def test_gpu_falling_off_the_bus_degrades_to_cpu_only(caplog):
    agent = GpuAgent(FakeGpuBackend(2, "steady", fail_after=3),
                     Policy(gpu_peak_utilization_percent=70, max_slowdown=2.0))
    for _ in range(3):
        assert agent.cycle(1.0, 0.0, []) is not None
    assert agent.readings
    with caplog.at_level("WARNING", logger="throttledjob.sidecar"):
        for _ in range(5):
            assert agent.cycle(1.0, 0.0, []) is None
    assert agent.readings == [] and agent.error_lost
    assert "CPU-only" in agent.error
    assert agent.telemetry == "fake (simulated)"
    assert len([r for r in caplog.records if "CPU-only" in r.getMessage()]) == 1  # said once


def test_power_limit_lever_is_applied_and_restored():
    gpu = FakeGpuBackend(2, "steady")
    agent = GpuAgent(gpu, Policy(gpu_peak_power_watts=200, gpu_power_limit="allow"))
    agent.cycle(1.0, 0.0, [])
    # At the controller's setpoint (3% under the target), so no duty acts on top of it.
    assert gpu.limits == [194.0, 194.0]
    # Below the board's minimum: clamped (applied at the next read).
    agent.set_policy(Policy(gpu_peak_power_watts=50, gpu_power_limit="allow"))
    agent.cycle(1.0, 0.0, [])
    assert gpu.limits == [100.0, 100.0]
    agent.close()
    assert gpu.limits == [300.0, 300.0]


def test_a_cap_someone_put_back_is_set_again_at_the_next_cycle():
    """The node agent puts every cap back at its SIGTERM (a DaemonSet rolled while pods
    run); an admin may too. The limit read over the one set: the cap is set again, and a
    limit under it (something tighter) is left alone."""
    gpu = FakeGpuBackend(1, "steady")
    agent = GpuAgent(gpu, Policy(gpu_peak_power_watts=200, gpu_power_limit="allow"))
    agent.cycle(1.0, 0.0, [])
    assert gpu.limits == [194.0]
    gpu.set_power_limit_watts(0, 300.0)   # put back behind the sidecar's back
    agent.cycle(1.0, 0.0, [])
    assert gpu.limits == [194.0]
    gpu.set_power_limit_watts(0, 150.0)   # tighter than ours: not ours to lift
    calls = len(gpu.limit_calls)
    agent.cycle(1.0, 0.0, [])
    assert gpu.limits == [150.0] and len(gpu.limit_calls) == calls
    agent.close()
    assert gpu.limits == [300.0]


def test_a_policy_edit_that_denies_the_power_limit_puts_every_gpu_back_at_once():
    """The lever is the policy's alone: an edit to Deny restores the boards' own limits
    then and there, and the target is held back from the next cycle on."""
    gpu = FakeGpuBackend(2, "steady")
    agent = GpuAgent(gpu, Policy(gpu_peak_power_watts=200, gpu_power_limit="allow"))
    agent.cycle(1.0, 0.0, [])
    assert gpu.limits == [194.0, 194.0] and agent.state().capping
    agent.set_policy(Policy(gpu_peak_power_watts=200))
    assert gpu.limits == [300.0, 300.0] and not agent.state().power_limit_lever
    agent.cycle(1.0, 0.0, [])
    assert gpu.limits == [300.0, 300.0] and not agent.state().capping
    agent.close()


def test_power_limit_lever_is_off_by_default():
    gpu = FakeGpuBackend(1, "steady")
    agent = GpuAgent(gpu, Policy(gpu_peak_power_watts=200))
    agent.cycle(1.0, 0.0, [])
    agent.close()
    assert gpu.limit_calls == []


class _FakeNvml(types.SimpleNamespace):
    """The few pynvml calls the adapter makes, with NVML's own units (mW, MHz, percent)."""


def _patch_nvml(monkeypatch, fail_power: Exception | None = None,
                memory_v2: bool = True, samples: list[tuple[int, int]] | None = None,
                count: int = 1, lost: frozenset[int] = frozenset()):
    """`samples`: the driver's buffer of utilization samples (microseconds, percent);
    None: a board that keeps none. `count` GPUs (UUIDs GPU-1234, GPU-1235, ...), those
    of `lost` off the bus: every call on them fails with NVML_ERROR_GPU_IS_LOST."""
    handles = [types.SimpleNamespace(index=i, uuid=f"GPU-{1234 + i}") for i in range(count)]
    calls = []

    def by_uuid(uuid):
        found = [h for h in handles if h.uuid == uuid]
        if not found:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return found[0]

    def utilization_samples(h, kind, last_seen):
        assert kind == pynvml.NVML_GPU_UTILIZATION_SAMPLES
        if samples is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        got = [types.SimpleNamespace(timeStamp=t, sampleValue=types.SimpleNamespace(uiVal=v))
               for t, v in samples if t > last_seen]
        if not got:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, got

    def memory(h, version=None):
        # v1 counts the driver's reserved memory in `used`; v2 (nvidia-smi's) does not.
        if version is None:
            return types.SimpleNamespace(used=2**30 + 2**28, total=2**34)
        assert version == pynvml.nvmlMemory_v2
        if not memory_v2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return types.SimpleNamespace(used=2**30, reserved=2**28, total=2**34)

    def power(h):
        if fail_power:
            raise fail_power
        return 250_500  # mW

    fns = {
        "nvmlInit": lambda: None, "nvmlShutdown": lambda: calls.append("shutdown"),
        "nvmlDeviceGetCount": lambda: count,
        "nvmlDeviceGetHandleByIndex": lambda i: handles[i],
        "nvmlDeviceGetHandleByUUID": by_uuid,
        "nvmlDeviceGetIndex": lambda h: h.index,
        "nvmlDeviceGetUtilizationRates": lambda h: types.SimpleNamespace(gpu=87, memory=40),
        "nvmlDeviceGetSamples": utilization_samples,
        "nvmlDeviceGetMemoryInfo": memory,
        "nvmlDeviceGetUUID": lambda h: h.uuid, "nvmlDeviceGetName": lambda h: "A100",
        "nvmlDeviceGetPowerUsage": power,
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: 300_000,
        # The board's own limit: the BMC enforces less (300 W) for now.
        "nvmlDeviceGetPowerManagementLimit": lambda h: 350_000,
        "nvmlDeviceGetTemperature": lambda h, kind: 65,
        "nvmlDeviceGetClockInfo": lambda h, kind: 1410,
        "nvmlDeviceGetCurrentClocksEventReasons":
            lambda h: pynvml.nvmlClocksEventReasonSwPowerCap,
        "nvmlDeviceGetComputeRunningProcesses":
            lambda h: [types.SimpleNamespace(pid=42, usedGpuMemory=2**20),
                       types.SimpleNamespace(pid=43, usedGpuMemory=None)],
        "nvmlDeviceGetPowerManagementLimitConstraints": lambda h: (100_000, 400_000),
        "nvmlDeviceSetPowerManagementLimit": lambda h, mw: calls.append(("limit", mw)),
    }
    def on_the_bus(fn):
        def call(h, *args, **kwargs):
            if h.index in lost:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            return fn(h, *args, **kwargs)
        return call

    for name, fn in fns.items():
        if name.startswith("nvmlDevice") and name not in (
                "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByUUID"):
            fn = on_the_bus(fn)
        monkeypatch.setattr(pynvml, name, fn)
    return calls


def test_nvml_adapter_converts_to_base_units(monkeypatch):
    calls = _patch_nvml(monkeypatch)
    backend = NvmlBackend()
    (r,) = backend.read()
    assert r == GpuReading(index=0, uuid="GPU-1234", name="A100", utilization_ratio=0.87,
                           memory_used_bytes=2**30, memory_total_bytes=2**34,
                           power_watts=250.5, power_limit_watts=300.0,
                           temperature_celsius=65.0, sm_clock_hertz=1.41e9,
                           throttle_reasons=frozenset({"sw_power_cap"}),
                           process_memory_bytes={42: 2**20})
    assert backend.power_limit_range_watts(0) == (100.0, 400.0)
    backend.set_power_limit_watts(0, 200.0)
    backend.close()
    backend.close()
    assert calls == [("limit", 200_000), "shutdown"]


def test_nvml_adapter_reads_memory_v1_where_the_driver_has_no_v2(monkeypatch):
    _patch_nvml(monkeypatch, memory_v2=False)
    backend = NvmlBackend()
    assert [r.memory_used_bytes for r in backend.read() + backend.read()] == [2**30 + 2**28] * 2


def test_nvml_adapter_averages_the_utilization_samples_since_its_last_read(monkeypatch):
    """A held-back feeder makes the GPU busy in bursts: the last sample period alone (the
    87% of nvmlDeviceGetUtilizationRates here) reads whichever burst or pause it fell on;
    the interval's share is the mean of the driver's samples since the last read."""
    buffer = [(1_000_000, 10), (1_500_000, 90), (2_100_000, 100), (2_300_000, 0),
              (2_800_000, 50)]
    _patch_nvml(monkeypatch, samples=buffer)
    backend = NvmlBackend()
    (first,) = backend.read()     # the last second's: 2.1, 2.3 and 2.8 s
    assert first.utilization_ratio == pytest.approx(0.5)
    buffer += [(3_300_000, 20), (3_800_000, 40)]
    (second,) = backend.read()    # only what came after 2.8 s
    assert second.utilization_ratio == pytest.approx(0.3)
    (third,) = backend.read()     # nothing new: the last period's rate
    assert third.utilization_ratio == pytest.approx(0.87)


def test_nvml_utilization_is_averaged_since_each_readers_own_last_read(monkeypatch):
    """The node agent reads one board for every pod and for its scrape: each reader's
    utilization covers the time since its own last read, whoever read in between."""
    buffer = [(1_000_000, 10), (2_000_000, 50)]
    _patch_nvml(monkeypatch, samples=buffer)
    backend = NvmlBackend()
    backend.read_as("team/a")
    backend.read_as("team/b")
    buffer += [(2_500_000, 100), (3_000_000, 20)]
    backend.read_as("metrics")                  # a scrape between the pods' reads
    assert backend.read_as("team/a")[0].utilization_ratio == pytest.approx(0.6)
    buffer += [(3_500_000, 0)]
    assert backend.read_as("team/b")[0].utilization_ratio == pytest.approx(0.4)


def test_nvml_adapter_drops_unsupported_counters(monkeypatch):
    _patch_nvml(monkeypatch, fail_power=pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED))
    (r,) = NvmlBackend().read()
    assert r.power_watts is None and r.utilization_ratio == 0.87


def test_nvml_adapter_translates_a_lost_gpu(monkeypatch):
    _patch_nvml(monkeypatch, fail_power=pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST))
    with pytest.raises(GpuError) as e:
        NvmlBackend().read()
    assert e.value.lost and "NVML" in str(e.value)


def test_nvml_adapter_leaves_a_lost_gpu_out_and_finds_the_others_one_by_one(monkeypatch):
    """NVML_ERROR_GPU_IS_LOST from one board once failed the read of every board, and with
    it every cap and restore of the node agent's. All of them lost: the GPUs are."""
    _patch_nvml(monkeypatch, count=3, lost=frozenset({1}))
    backend = NvmlBackend()
    assert [r.uuid for r in backend.read()] == ["GPU-1234", "GPU-1236"]
    assert backend.index_of("GPU-1236") == 2 and backend.index_of("GPU-9999") is None
    with pytest.raises(GpuError) as e:
        backend.power_management_limit_watts(1)
    assert e.value.lost
    assert backend.power_management_limit_watts(2) == 350.0


def test_nvml_adapter_with_every_gpu_lost_still_says_they_are_lost(monkeypatch):
    _patch_nvml(monkeypatch, count=2, lost=frozenset({0, 1}))
    with pytest.raises(GpuError) as e:
        NvmlBackend().read()
    assert e.value.lost


def test_nvml_adapter_reads_the_boards_own_limit_apart_from_the_one_enforced(monkeypatch):
    """What a write sets, and so what is kept to put back, is the management limit; the
    reading's limit is the one enforced, which the BMC may hold lower."""
    _patch_nvml(monkeypatch)
    backend = NvmlBackend()
    assert backend.read()[0].power_limit_watts == 300.0
    assert backend.power_management_limit_watts(0) == 350.0


def test_a_power_target_over_an_admins_lower_limit_leaves_that_limit_alone():
    gpu = FakeGpuBackend(1, "steady")
    gpu.limits[0] = 150.0   # nvidia-smi -pl 150, by the node's admin
    agent = GpuAgent(gpu, Policy(gpu_peak_power_watts=250, gpu_power_limit="allow"))
    agent.cycle(1.0, 0.0, [])
    agent.close()
    assert gpu.limits == [150.0] and gpu.limit_calls == []


def test_a_lever_allowed_with_no_power_target_writes_no_board():
    gpu = FakeGpuBackend(2, "steady")
    agent = GpuAgent(gpu, Policy(gpu_peak_utilization_percent=70, gpu_power_limit="allow"))
    for _ in range(3):
        agent.cycle(1.0, 0.0, [])
    agent.close()
    assert gpu.limit_calls == []


def test_the_limit_put_back_is_the_boards_own_not_what_a_bmc_enforced():
    gpu = FakeGpuBackend(1, "steady")
    gpu.out_of_band_limits[0] = 250.0
    agent = GpuAgent(gpu, Policy(gpu_peak_power_watts=200, gpu_power_limit="allow"))
    agent.cycle(1.0, 0.0, [])
    assert gpu.limits == [194.0] and agent.state().capping
    agent.close()
    assert gpu.limits == [300.0]


def test_a_cap_is_never_over_a_limit_an_admin_lowered_while_it_held():
    """Capped at 194 W, the admin sets 150 W; the target then moves to 250 W: the admin's
    limit is the board's own from then on, neither raised nor written back at exit."""
    gpu = FakeGpuBackend(1, "steady")
    agent = GpuAgent(gpu, Policy(gpu_peak_power_watts=200, gpu_power_limit="allow"))
    agent.cycle(1.0, 0.0, [])
    gpu.limits[0] = 150.0
    agent.set_policy(Policy(gpu_peak_power_watts=250, gpu_power_limit="allow"))
    agent.cycle(1.0, 0.0, [])
    assert gpu.limits == [150.0]
    agent.close()
    assert gpu.limits == [150.0]


def test_a_simulated_boards_limit_outlives_the_process_that_set_it(tmp_path) -> None:
    """As a real board's: with THROTTLEDJOB_FAKE_GPU_LIMITS_FILE a node agent killed and
    started again finds the cap it set still in force (the live test kills it)."""
    env = {"THROTTLEDJOB_FAKE_GPUS": "2",
           "THROTTLEDJOB_FAKE_GPU_LIMITS_FILE": str(tmp_path / "board.json")}
    FakeGpuBackend.from_environ(env).set_power_limit_watts(1, 150.0)
    again = FakeGpuBackend.from_environ(env)
    assert [again.power_management_limit_watts(i) for i in (0, 1)] == [300.0, 150.0]
    assert FakeGpuBackend.from_environ({"THROTTLEDJOB_FAKE_GPUS": "2"}).limits == [300.0] * 2


@pytest.mark.parametrize("lever", [True, False], ids=["capped", "held-back"])
@pytest.mark.parametrize("idle_first", [True, False], ids=["floor-read", "floor-unknown"])
def test_the_demand_a_gpu_budget_weighs_is_what_the_boards_would_draw_unheld(lever, idle_first):
    """gpuDemandHistory's figure (GpuState.demand_watts): two simulated boards held to
    150 W each, by their caps or by holding the feeder back, report what they would draw
    with neither (the same boards at the same instant, unheld): within 2% once the idle
    floor is read, within 5% before (the floor then taken as 0); and what they draw,
    where nothing holds them."""
    def trace(t: int) -> float:
        return 0.0 if idle_first and t < 3 else 0.95

    policy = Policy(gpu_peak_power_watts=150.0, max_slowdown=3.0,
                    gpu_power_limit="allow" if lever else None)
    gpu, free = FakeGpuBackend(2, trace), FakeGpuBackend(2, trace)
    agent = GpuAgent(gpu, policy)
    duty = 0.0
    for _ in range(30):
        gpu.feed(duty)
        duty = agent.cycle(1.0, duty, []) or 0.0
        unheld = sum(r.power_watts for r in free.read())
    state = agent.state()
    assert max(r.power_watts for r in state.readings) <= 150.0 * 1.01  # held
    assert (state.capping, duty > 0.1) == (lever, not lever)
    assert state.demand_watts == pytest.approx(unheld, rel=0.02 if idle_first else 0.05)
    assert state.ranges == ((100.0, 300.0),) * 2
    agent.set_policy(Policy())
    gpu.feed(0.0)
    agent.cycle(1.0, 0.0, [])
    assert agent.state().demand_watts == pytest.approx(sum(r.power_watts for r in free.read()),
                                                       rel=1e-3)
