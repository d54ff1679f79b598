"""Prometheus metrics: one custom collector that renders the latest Snapshot.

Naming (docs/metrics.md): prefix `throttledjob_`, base units (seconds, bytes, watts,
hertz, celsius), counters end in `_total`, every utilization or fraction is a `_ratio`
in 0..1, CPU rates are in cores as Kubernetes counts them. GPU series carry `gpu`
(index) and `UUID`, as dcgm-exporter's do, so the two join in PromQL. A value the
sidecar cannot read is left out (the series is absent), never exported as zero.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.process_collector import ProcessCollector

from throttledjob import __version__
from throttledjob.contracts.status import LEVERS
from throttledjob.gpu.backend import THROTTLE_REASONS

from .snapshot import Snapshot, SnapshotHolder

P = "throttledjob_"
# The kinds of problem the sidecar reports (exporter.report); signals: a stop it could
# not announce to the guard, so it holds nothing back.
PROBLEM_KINDS = ("policy", "progress", "settings", "gpu", "processes", "signals")
GPU_LABELS = ["gpu", "UUID"]


class SnapshotCollector:
    def __init__(self, holder: SnapshotHolder) -> None:
        self.holder = holder

    def describe(self) -> list[Metric]:
        # Collected lazily: registering must not need a snapshot yet.
        return []

    def collect(self) -> Iterator[Metric]:
        s = self.holder.get()
        if s is None:
            return
        yield from _build_info(s)
        yield from _workload(s)
        yield from _targets(s)
        yield from _control(s)
        yield from _gpus(s)
        yield from _health(s)


def make_registry(holder: SnapshotHolder, process_metrics: bool = True) -> CollectorRegistry:
    """A private registry: nothing lands in prometheus_client's global default one."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(holder))
    if process_metrics:  # the sidecar's own CPU and memory: its footprint, live
        ProcessCollector(registry=registry)
    return registry


def _gauge(name: str, doc: str, value: float | None, labels: dict[str, str] | None = None
           ) -> Iterator[Metric]:
    if value is None:
        return
    g = GaugeMetricFamily(P + name, doc, labels=list(labels or {}))
    g.add_metric(list((labels or {}).values()), float(value))
    yield g


def _build_info(s: Snapshot) -> Iterator[Metric]:
    g = GaugeMetricFamily(P + "build_info", "Always 1; labels say what this sidecar runs.",
                          labels=["version", "mode", "enforcement", "gpu_telemetry"])
    g.add_metric([__version__, s.result.policy.mode, s.result.plan.enforcement,
                  s.gpu_telemetry], 1.0)
    yield g


def _workload(s: Snapshot) -> Iterator[Metric]:
    result, last = s.result, s.result.last
    c = CounterMetricFamily(P + "workload_cpu_seconds",
                            "CPU time used by the workload's processes, in seconds.")
    c.add_metric([], result.cpu_seconds)
    yield c
    yield from _gauge("workload_cpu_cores", "CPU used by the workload over the last control "
                      "interval, in cores.", last.usage_cores)
    yield from _gauge("workload_processes", "Processes counted as the workload.",
                      result.processes)
    steps = CounterMetricFamily(P + "workload_steps",
                                "Steps reported by the workload's runtime library.")
    steps.add_metric([], last.steps)
    yield steps
    yield from _gauge("workload_steps_per_second",
                      "Throughput over the last 10 s, in steps per second.",
                      last.pace.steps_per_second)
    peak = GaugeMetricFamily(P + "workload_cpu_peak_cores", "Peak CPU of the workload over "
                             "the run from 1-second samples, in cores (stat: p99 or max).",
                             labels=["stat"])
    for stat, value in (("p99", result.cpu.p99), ("max", result.cpu.max)):
        if value is not None:
            peak.add_metric([stat], value)
    if peak.samples:
        yield peak


def _targets(s: Snapshot) -> Iterator[Metric]:
    p = s.result.policy
    yield from _gauge("cpu_target_cores", "CPU peak target, in cores.", p.cpu_peak_cores)
    # Named before "rate" took over from "quota" in the code (the kernel's quota is
    # throttledjob_cpu_periods_total, _cpu_throttled_periods_total and
    # _cpu_throttled_seconds_total); kept for the dashboards and alerts that read it.
    yield from _gauge("cpu_quota_cores", "CPU rate the pacing and signals hold the workload "
                      "to now (the controller's setpoint), in cores.", s.result.last.rate_cores)
    yield from _gauge("gpu_utilization_target_ratio", "GPU peak utilization target per GPU, "
                      "0 to 1.", None if p.gpu_peak_utilization_percent is None
                      else p.gpu_peak_utilization_percent / 100.0)
    yield from _gauge("gpu_power_target_watts", "GPU peak power target per GPU, in watts.",
                      p.gpu_peak_power_watts)
    yield from _gauge("gpu_memory_fraction_target_ratio", "GPU memory fraction the workload "
                      "is told to cap itself at, 0 to 1.", p.gpu_memory_fraction)
    yield from _gauge("slowdown_budget_ratio", "Largest slowdown allowed (maxSlowdown), as "
                      "throttled over unthrottled wall time.", p.max_slowdown)


def _control(s: Snapshot) -> Iterator[Metric]:
    result, run = s.result, s.run
    yield from _gauge("throttle_level_ratio", "Fraction of the last interval the workload "
                      "was held back, 0 to 1.", run.throttle_level)
    yield from _gauge("gpu_duty_ratio", "Fraction of time the GPU controller asks to hold "
                      "the workload back, 0 to 1.", result.last.gpu_duty)
    yield from _gauge("slowdown_estimate_ratio", "Estimated slowdown so far: wall time over "
                      "wall time minus time held back.", run.slowdown)
    yield from _gauge("slowdown_estimate_high_ratio", "The most the slowdown so far can be: "
                      "lever settings charged at the most they can cost.",
                      run.slowdown_high)
    yield from _gauge("throttling", "1 while a controller is holding the workload back.",
                      float(result.last.throttling))
    yield from _gauge("target_met", "1 while the recent p99 of every target is at or under "
                      "it; absent while a target not missed has no sample yet.",
                      None if run.target_met is None else float(run.target_met))
    yield from _gauge("budget_exhausted", "1 while the slowdown budget stops a target from "
                      "being met (within the recent window target_met is judged over).",
                      float(result.budget_exhausted_recently))
    c = CounterMetricFamily(P + "budget_exhausted_seconds", "Time spent with the slowdown "
                            "budget exhausted, in seconds.")
    c.add_metric([], result.budget_exhausted_seconds)
    yield c
    paused = CounterMetricFamily(P + "paused_seconds", "Time the workload was held back, in "
                                 "seconds, by lever (quota, signals or pacing).",
                                 labels=["lever"])
    for lever, seconds in sorted(run.paused_by_lever.items()):
        paused.add_metric([lever], seconds)
    yield paused
    k = result.kernel_throttling
    if k is not None:  # the kernel's quota holds the workload (cpu.stat of its cgroup)
        for name, help_, value in (
                ("cpu_periods_total", "CFS bandwidth periods elapsed under the kernel "
                 "quota.", k.nr_periods),
                ("cpu_throttled_periods_total", "CFS bandwidth periods in which the kernel "
                 "quota throttled the workload.", k.nr_throttled),
                ("cpu_throttled_seconds_total", "Time the workload's threads waited for the "
                 "kernel quota, summed over CPUs, in seconds.", k.throttled_seconds)):
            c = CounterMetricFamily(P + name.removesuffix("_total"), help_)
            c.add_metric([], value)
            yield c
    active = GaugeMetricFamily(P + "lever_active", "1 for each lever in use.",
                               labels=["lever"])
    for lever in LEVERS:
        active.add_metric([lever], float(lever in run.levers))
    yield active


def _gpus(s: Snapshot) -> Iterator[Metric]:
    peaks = GaugeMetricFamily(P + "gpu_utilization_peak_ratio", "Peak utilization of the "
                              "busiest watched GPU over the run from 1-second samples, 0 to 1 "
                              "(stat: p99 or max).", labels=["stat"])
    power_peaks = GaugeMetricFamily(P + "gpu_power_peak_watts", "Peak power of the busiest "
                                    "watched GPU over the run from 1-second samples, in watts "
                                    "(stat: p99 or max).", labels=["stat"])
    for family, peak in ((peaks, s.run.gpu_util), (power_peaks, s.run.gpu_power)):
        for stat, value in (("p99", peak.p99), ("max", peak.max)):
            if value is not None:
                family.add_metric([stat], value)
        if family.samples:
            yield family
    if not s.gpus:
        return
    families = {
        "utilization_ratio": ("GPU utilization: fraction of time a kernel ran, 0 to 1.",
                              lambda r: r.utilization_ratio),
        "memory_used_bytes": ("GPU memory used, in bytes.", lambda r: r.memory_used_bytes),
        "memory_total_bytes": ("GPU memory installed, in bytes.",
                               lambda r: r.memory_total_bytes),
        "memory_used_ratio": ("GPU memory used over installed, 0 to 1.",
                              lambda r: r.memory_used_bytes / r.memory_total_bytes
                              if r.memory_total_bytes else None),
        "power_watts": ("GPU power draw, in watts.", lambda r: r.power_watts),
        "power_limit_watts": ("GPU power limit in force, in watts.",
                              lambda r: r.power_limit_watts),
        "temperature_celsius": ("GPU temperature, in degrees Celsius.",
                                lambda r: r.temperature_celsius),
        "sm_clock_hertz": ("GPU SM clock, in hertz.", lambda r: r.sm_clock_hertz),
    }
    for suffix, (doc, read) in families.items():
        g = GaugeMetricFamily(f"{P}gpu_{suffix}", doc, labels=GPU_LABELS)
        for r in s.gpus:
            value = read(r)
            if value is not None:
                g.add_metric([str(r.index), r.uuid], float(value))
        if g.samples:
            yield g
    reasons = GaugeMetricFamily(P + "gpu_clock_throttle_reason", "1 while the GPU's clocks "
                                "are held down for this reason (NVML clock event reasons).",
                                labels=[*GPU_LABELS, "reason"])
    info = GaugeMetricFamily(P + "gpu_info", "Always 1; names each watched GPU.",
                             labels=[*GPU_LABELS, "model_name", "simulated"])
    procs = GaugeMetricFamily(P + "gpu_process_memory_used_bytes", "GPU memory used by each "
                              "process, in bytes, where the driver reports it.",
                              labels=[*GPU_LABELS, "pid"])
    simulated = "true" if s.gpu_telemetry.startswith("fake") else "false"
    for r in s.gpus:
        labels = [str(r.index), r.uuid]
        info.add_metric([*labels, r.name, simulated], 1.0)
        for reason in THROTTLE_REASONS:
            reasons.add_metric([*labels, reason], float(reason in r.throttle_reasons))
        for pid, used in sorted(r.process_memory_bytes.items()):
            procs.add_metric([*labels, str(pid)], float(used))
    yield info
    yield reasons
    if procs.samples:
        yield procs


def _health(s: Snapshot) -> Iterator[Metric]:
    h = s.health
    c = CounterMetricFamily(P + "cycles", "Control cycles run by this sidecar.")
    c.add_metric([], h.cycles)
    yield c
    yield from _gauge("cycle_duration_seconds", "Duration of the last control cycle, in "
                      "seconds.", h.last_cycle_duration)
    yield from _gauge("last_cycle_timestamp_seconds", "Unix time of the last control cycle, "
                      "in seconds.", s.time)
    yield from _gauge("start_time_seconds", "Unix time the sidecar started, in seconds.",
                      h.started)
    errors = CounterMetricFamily(P + "errors", "Problems met, by kind "
                                 f"({', '.join(PROBLEM_KINDS)}).", labels=["kind"])
    problems = GaugeMetricFamily(P + "problem", "1 while a problem of this kind is in force "
                                 "(see /status for the message).", labels=["kind"])
    for kind in PROBLEM_KINDS:
        errors.add_metric([kind], h.errors_total.get(kind, 0))
        problems.add_metric([kind], float(kind in h.problems))
    yield errors
    yield problems
    reloads = CounterMetricFamily(P + "policy_reloads", "Policy file reloads, by result.",
                                  labels=["result"])
    for result, count in sorted(h.policy_reloads.items()):
        reloads.add_metric([result], count)
    yield reloads
    telemetry = GaugeMetricFamily(P + "telemetry_available", "1 when the sidecar can measure "
                                  "this resource.", labels=["resource"])
    telemetry.add_metric(["cpu"], float(s.result.processes > 0))
    telemetry.add_metric(["gpu"], float(bool(s.gpus)))
    yield telemetry
