"""The operator's own Prometheus metrics (`GET /metrics` on --metrics-port): what its
periodic work read, resized and failed, and the ThrottledJobs it watches by phase, so a
platform engineer sees it at work without reading Events.

Counters are module-level, as prometheus_client's are: one operator per process. The
phase gauge reads the operator's state at each scrape (a collector), never a copy.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector

from throttledjob import __version__

from .fleet import CPU, GPU

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
P = "throttledjob_operator_"

SIDECAR_READS = Counter(P + "sidecar_reads", "Reads of a pod sidecar's /status, by result "
                        "(success, failure: no answer in the read deadline, or a bad one).",
                        ["result"], registry=REGISTRY)
RESIZES = Counter(P + "pod_resizes", "pods/resize calls the operator made, by result "
                  "(applied; refused by the API server: the pod keeps its limits).",
                  ["result"], registry=REGISTRY)
PERIODIC_FAILURES = Counter(P + "periodic_failures", "Periodic reads that failed (an API "
                            "error), by read; each is tried again at the next tick.",
                            ["read"], registry=REGISTRY)
SKIPPED = Counter(P + "periodic_skipped", "Periodic reads not started because the same "
                  "ThrottledJob's previous one still ran (slow sidecars, a busy pool).",
                  registry=REGISTRY)
ADMISSIONS = Counter(P + "admissions", "Pods the admission webhook answered, by result "
                     "(injected; skipped: no attached ThrottledJob claims it; error: "
                     "allowed unthrottled, failing open).", ["result"], registry=REGISTRY)
for _result in ("injected", "skipped", "error"):
    ADMISSIONS.labels(_result)
for _result in ("success", "failure"):
    SIDECAR_READS.labels(_result)
for _result in ("applied", "refused"):
    RESIZES.labels(_result)


class _Phases:
    """throttledjob_operator_throttledjobs{phase}: the ThrottledJobs this process watches;
    and each ThrottleBudget's last split (fleet.py), where one is known."""

    def __init__(self, seen: Callable[[], Mapping[Any, tuple[str | None, str | None]]],
                 fleet: Callable[[], Any] | None = None) -> None:
        self._seen, self._fleet = seen, fleet

    def collect(self) -> Iterator[Metric]:
        g = GaugeMetricFamily(P + "throttledjobs", "ThrottledJobs the operator watches, by "
                              "phase (Unknown: none yet).", labels=["phase"])
        for phase, count in sorted(Tally(p or "Unknown" for p, _ in
                                         dict(self._seen()).values()).items()):
            g.add_metric([phase], count)
        yield g
        info = GaugeMetricFamily(P + "build_info", "Always 1; labels say what this operator "
                                 "runs.", labels=["version"])
        info.add_metric([__version__], 1.0)
        yield info
        if self._fleet is not None:
            yield from budget_metrics(self._fleet())


# A budget's status figure (fleet.BUDGET_FIGURES) -> its series and HELP.
BUDGET_SERIES = {
    "cpuBudgetCores": ("budget_cpu_cores", "A ThrottleBudget's CPU peak in force now "
                       "(schedule and signal applied)."),
    "cpuCores": ("budget_cpu_use_cores", "A ThrottleBudget's members' CPU use summed, at "
                 "their last reads."),
    "gpuBudgetWatts": ("budget_gpu_watts", "A ThrottleBudget's GPU power peak in force now "
                       "(schedule and signal applied)."),
    "gpuDemandWatts": ("budget_gpu_demand_watts", "What a ThrottleBudget's members' GPUs "
                       "would draw unheld, summed (the means of their last reads)."),
}
# A resource -> the series of each member's share of it, and its HELP.
SHARE_SERIES = {
    CPU: ("budget_share_cpu_cores", "A member's part of a ThrottleBudget's CPU, job-wide."),
    GPU: ("budget_share_gpu_watts", "A member's part of a ThrottleBudget's GPU power, "
          "job-wide."),
}


def budget_metrics(fleet: Any) -> Iterator[Metric]:
    """The fleet's row of the dashboard: each budget in force and its members' use
    against it, and each member's share (fleet.Fleet's record of the last splits)."""
    labels = ["namespace", "budget"]
    figures = {figure: GaugeMetricFamily(P + name, help_, labels=labels)
               for figure, (name, help_) in BUDGET_SERIES.items()}
    shares = {resource: GaugeMetricFamily(P + name, help_, labels=[*labels, "throttledjob"])
              for resource, (name, help_) in SHARE_SERIES.items()}
    with fleet.lock:
        for (ns, name), values in sorted(fleet.budgets.items()):
            for figure, value in values.items():
                figures[figure].add_metric([ns, name], value)
        for resource, family in shares.items():
            for (ns, member), by_budget in sorted(fleet.shares_of(resource).items()):
                for name, value in sorted(by_budget.items()):
                    family.add_metric([ns, name, member], value)
    yield from (*figures.values(), *shares.values())


def serve(port: int, seen: Callable[[], Mapping[Any, tuple[str | None, str | None]]],
          address: str = "0.0.0.0", fleet: Callable[[], Any] | None = None) -> None:
    """Serve /metrics on `address:port` from a daemon thread; `seen` gives the watched
    ThrottledJobs ((namespace, name) -> (phase, Job name)), `fleet` the budgets' record
    (fleet.Fleet). Raises OSError where the port cannot be bound."""
    REGISTRY.register(_Phases(seen, fleet))
    start_http_server(port, address, registry=REGISTRY)
