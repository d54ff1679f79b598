"""What the operator keeps between passes about ThrottledJobs under a ThrottleBudget: each
member's recent demand of CPU and of GPU power (from its sidecars' reads) and the share
each budget gave it; and `held_policy`/`held_power`, how a share becomes the member's
policy.

A member's sidecars are read by its own pass every status interval (reconcile.py), which
records here what they said; the budget's pass (budget_pass.py) splits from that record,
with no read of its own, and sets the shares; the member's next pass holds its policy to
the lowest of them (two budgets over one ThrottledJob: the lower wins). Memory only: after
a restart a budget's pass starts from the shares its status shows, so the last split
holds until the new one is made.
"""

from __future__ import annotations

import bisect
import copy
import math
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from throttledjob.contracts.status import finite_number

from . import child
from .cpu_limits import cores
from .job_split import job_scoped
from .validation import GPU_RESOURCES

# The demand a split weighs: the member's last seconds (its sidecars' cpuDemandHistory,
# merged), or, from sidecars that keep none, its last reads (one a status interval).
HISTORY = 300

TjKey = tuple[str, str]
CPU, GPU = "cpu", "gpu"  # a budget's resources: cores, and GPU board watts
# What the metrics show of a budget's status (operator/metrics.py budget_metrics).
BUDGET_FIGURES = ("cpuBudgetCores", "cpuCores", "gpuBudgetWatts", "gpuDemandWatts")


@dataclass
class Fleet:
    demand: dict[TjKey, deque[float]] = field(default_factory=dict)
    floors: dict[TjKey, float] = field(default_factory=dict)
    pods: dict[TjKey, int] = field(default_factory=dict)
    use: dict[TjKey, float] = field(default_factory=dict)  # cores, at its last read
    answered: dict[TjKey, bool] = field(default_factory=dict)  # its last read was whole
    reads: dict[TjKey, int] = field(default_factory=dict)  # its whole reads so far
    seen_until: dict[TjKey, float] = field(default_factory=dict)  # its last second kept
    # budget -> its status's BUDGET_FIGURES at its last split (those it has)
    budgets: dict[TjKey, dict[str, float]] = field(default_factory=dict)
    # member -> budget name -> its share, cores job-wide
    shares: dict[TjKey, dict[str, float]] = field(default_factory=dict)
    # member -> the budget that keeps it suspended (its floor did not fit: to_suspend)
    suspended: dict[TjKey, str] = field(default_factory=dict)
    # member -> its Kueue Workload's priority (from its WorkloadPriorityClass)
    priorities: dict[TjKey, int] = field(default_factory=dict)
    # The same for a GPU-watt budget: its GPUs' draw unheld each recent second (its
    # sidecars' gpuDemandHistory, merged), its GPUs, the least their limits can be set
    # to together, and member -> budget name -> its share, watts job-wide.
    gpu_demand: dict[TjKey, deque[float]] = field(default_factory=dict)
    gpu_seen_until: dict[TjKey, float] = field(default_factory=dict)
    gpus: dict[TjKey, int] = field(default_factory=dict)
    gpu_floors: dict[TjKey, float] = field(default_factory=dict)
    watts: dict[TjKey, dict[str, float]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, key: TjKey, reports: Mapping[str, Mapping[str, Any]], floor: float,
               answered: bool) -> None:
        """One read of a member's sidecars: `reports` pod uid -> /status; `answered`:
        every running pod's sidecar did (else its demand is not whole, and not kept)."""
        if not reports:
            return
        use = sum((r.get("observed") or {}).get("cpuCores") or 0.0 for r in reports.values())
        with self.lock:
            self.use[key] = use
            self.pods[key] = len(reports)
            self.floors[key] = floor
            self.answered[key] = answered
            if not answered:
                return
            self.reads[key] = self.reads.get(key, 0) + 1
            histories = [r.get("cpuDemandHistory") or [] for r in reports.values()]
            if not self._keep(key, self.demand, self.seen_until, histories) \
                    and not all(histories):
                self.demand[key].append(sum(pod_demand(r) for r in reports.values()))
            boards = [[g for g in (r.get("telemetry") or {}).get("gpus") or []
                       if isinstance(g, Mapping)] for r in reports.values()]
            self.gpus[key] = sum(map(len, boards))
            self.gpu_floors[key] = sum(finite_number(g.get("minLimitWatts")) or 0.0
                                       for pod in boards for g in pod)
            if self.gpus[key]:
                self._keep(key, self.gpu_demand, self.gpu_seen_until,
                           [r.get("gpuDemandHistory") or []
                            for r, pod in zip(reports.values(), boards, strict=True) if pod])

    def _keep(self, key: TjKey, demand: dict[TjKey, deque[float]],
              seen_until: dict[TjKey, float], histories: list[Any]) -> bool:
        """The seconds of the pods' `histories` not kept yet, merged (merged), onto the
        member's `demand`; False where there were none."""
        kept = demand.setdefault(key, deque(maxlen=HISTORY))
        seconds = merged(histories, seen_until.get(key, 0.0))
        if seconds:
            kept.extend(value for _, value in seconds)
            seen_until[key] = seconds[-1][0]
        return bool(seconds)

    def share(self, key: TjKey, resource: str = CPU) -> tuple[float, str] | None:
        """The lowest share any budget gives the member, and that budget's name."""
        with self.lock:
            by_budget = self.shares_of(resource).get(key) or {}
            if not by_budget:
                return None
            budget = min(by_budget, key=lambda b: (by_budget[b], b))
            return by_budget[budget], budget

    def held(self, key: TjKey, policy_doc: Mapping[str, Any],
             spec: Mapping[str, Any]) -> Mapping[str, Any]:
        """The member's policy held to the lowest share a budget gives it of each
        resource (held_policy, held_power), or `policy_doc` itself where none does: for
        the pass that makes its Job (or admits its pods) and every pass after."""
        share, watts = self.share(key), self.share(key, GPU)
        doc = policy_doc
        if share is not None:
            doc = held_policy(doc, spec, share[0], self.pods.get(key) or child.pods_at_once(spec))
        if watts is not None:
            doc = held_power(doc, watts[0], self.gpus.get(key) or template_gpus(spec))
        return doc

    def set_share(self, key: TjKey, budget: str, value: float | None,
                  resource: str = CPU) -> None:
        """The member's share of `budget` (cores, or watts for GPU); None: it has none."""
        with self.lock:
            table = self.shares_of(resource)
            if value is None:
                table.get(key, {}).pop(budget, None)
            else:
                table.setdefault(key, {})[budget] = value

    def shares_of(self, resource: str) -> dict[TjKey, dict[str, float]]:
        """member -> budget -> its share of `resource` (the table itself)."""
        return self.watts if resource == GPU else self.shares

    def set_suspended(self, key: TjKey, budget: str | None) -> None:
        with self.lock:
            if budget is None:
                self.suspended.pop(key, None)
            else:
                self.suspended[key] = budget

    def set_budget(self, key: TjKey, figures: Mapping[str, float] | None) -> None:
        """A budget's last split: the figures of its status the metrics show (None: the
        budget is gone)."""
        with self.lock:
            if figures is None:
                self.budgets.pop(key, None)
            else:
                self.budgets[key] = {k: v for k, v in figures.items() if k in BUDGET_FIGURES}

    def forget(self, key: TjKey) -> None:
        with self.lock:
            for table in (self.demand, self.floors, self.pods, self.use, self.answered,
                          self.reads, self.seen_until, self.shares, self.suspended,
                          self.priorities, self.gpu_demand, self.gpu_seen_until, self.gpus,
                          self.gpu_floors, self.watts):
                table.pop(key, None)


def merged(histories: Sequence[Sequence[Sequence[float]]],
           after: float) -> list[tuple[float, float]]:
    """A member's demand each whole second after `after` that every pod's history
    (cpuDemandHistory: [time, cores], oldest first) covers: at each, every pod's latest
    sample summed. Empty where a pod has none (its sidecar keeps no history)."""
    if not histories or not all(histories):
        return []
    times = [[sample[0] for sample in h] for h in histories]
    start = max(after, max(t[0] for t in times))
    out = []
    for second in range(math.floor(start) + 1, math.floor(min(t[-1] for t in times)) + 1):
        out.append((float(second), sum(h[bisect.bisect_right(t, second) - 1][1]
                                        for h, t in zip(histories, times, strict=True))))
    return out


def pod_demand(report: Mapping[str, Any]) -> float:
    """The cores a pod's workload would have used last interval: its containers' demand
    (use plus what the quota held back), or its use where the sidecar cannot tell."""
    demand = report.get("cpuDemandCores") or {}
    if demand:
        return float(sum(demand.values()))
    return float((report.get("observed") or {}).get("cpuCores") or 0.0)


def held_policy(policy_doc: Mapping[str, Any], spec: Mapping[str, Any], share: float,
                pods: int) -> dict[str, Any]:
    """The member's policy under a budget's `share` (cores, job-wide): its CPU target the
    lower of its own and the share (a pod's part of it under scope Pod, `pods` of them),
    held Hard: the split already weighed its maxSlowdown, and a lift past the share would
    break the fleet's peak."""
    doc = copy.deepcopy(dict(policy_doc))
    part = share if job_scoped(spec) else share / max(1, pods)
    targets = doc.setdefault("targets", {})
    cpu = targets.setdefault("cpu", {})
    own = cores(cpu.get("peak"))
    # Rounded down to the millicore: the members' limits never pass the budget together.
    held = min(part, own if own is not None else part)
    cpu["peak"] = f"{max(1, millicores(held))}m"
    targets["hold"] = "Hard"
    return doc


def held_power(policy_doc: Mapping[str, Any], watts: float, gpus: int) -> dict[str, Any]:
    """The member's policy under a GPU-watt budget's share (`watts`, job-wide): its GPU
    power target each GPU's part of it (`gpus` of them), or its own where lower; held
    Hard, as held_policy."""
    doc = copy.deepcopy(dict(policy_doc))
    targets = doc.setdefault("targets", {})
    gpu = targets.setdefault("gpu", {})
    part = math.floor(watts / max(1, gpus))  # whole watts, down: together within the share
    own = finite_number(gpu.get("peakPowerWatts"))
    gpu["peakPowerWatts"] = max(1, min(part, own) if own is not None else part)
    targets["hold"] = "Hard"
    return doc


def template_gpus(spec: Mapping[str, Any]) -> int:
    """The GPUs the member's pods ask for, all running at once (0: none, or no template:
    attach mode reads them from its sidecars)."""
    total = 0
    for _, count, pod in child.pod_groups(spec):
        for c in pod.get("containers") or []:
            limits = (c.get("resources") or {}).get("limits") or {}
            total += count * sum(int(limits.get(r) or 0) for r in GPU_RESOURCES
                                 if str(limits.get(r) or 0).isdigit())
    return total


def millicores(value: float) -> int:
    """`value` cores in whole millicores, rounded down (past float noise)."""
    return math.floor(value * 1000 + 1e-6)
