"""What the operator keeps between passes about ThrottledJobs under a ThrottleBudget: each
member's recent demand (from its sidecars' reads) and the share each budget gave it; and
`held_policy`, how a share becomes the member's policy.

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

from . import child
from .cpu_limits import cores
from .job_split import job_scoped

# The demand a split weighs: the member's last seconds (its sidecars' cpuDemandHistory,
# merged), or, from sidecars that keep none, its last reads (one a status interval).
HISTORY = 300

TjKey = tuple[str, str]


@dataclass
class Fleet:
    demand: dict[TjKey, deque[float]] = field(default_factory=dict)
    floors: dict[TjKey, float] = field(default_factory=dict)
    pods: dict[TjKey, int] = field(default_factory=dict)
    use: dict[TjKey, float] = field(default_factory=dict)  # cores, at its last read
    answered: dict[TjKey, bool] = field(default_factory=dict)  # its last read was whole
    reads: dict[TjKey, int] = field(default_factory=dict)  # its whole reads so far
    seen_until: dict[TjKey, float] = field(default_factory=dict)  # its last second kept
    # budget -> (its cores in force, its members' use summed) at its last split
    budgets: dict[TjKey, tuple[float, float]] = field(default_factory=dict)
    # member -> budget name -> its share, cores job-wide
    shares: dict[TjKey, dict[str, float]] = field(default_factory=dict)
    # member -> the budget that keeps it suspended (its floor did not fit: to_suspend)
    suspended: dict[TjKey, str] = field(default_factory=dict)
    # member -> its Kueue Workload's priority (from its WorkloadPriorityClass)
    priorities: dict[TjKey, int] = field(default_factory=dict)
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
            kept = self.demand.setdefault(key, deque(maxlen=HISTORY))
            seconds = merged([r.get("cpuDemandHistory") or [] for r in reports.values()],
                             self.seen_until.get(key, 0.0))
            if seconds:
                kept.extend(cores for _, cores in seconds)
                self.seen_until[key] = seconds[-1][0]
            elif not all(r.get("cpuDemandHistory") for r in reports.values()):
                kept.append(sum(pod_demand(r) for r in reports.values()))

    def share(self, key: TjKey) -> tuple[float, str] | None:
        """The lowest share any budget gives the member, and that budget's name."""
        with self.lock:
            by_budget = self.shares.get(key) or {}
            if not by_budget:
                return None
            budget = min(by_budget, key=lambda b: (by_budget[b], b))
            return by_budget[budget], budget

    def held(self, key: TjKey, policy_doc: Mapping[str, Any],
             spec: Mapping[str, Any]) -> Mapping[str, Any]:
        """The member's policy held to the lowest share a budget gives it (held_policy),
        or `policy_doc` itself where none does: for the pass that makes its Job and every
        pass after."""
        share = self.share(key)
        if share is None:
            return policy_doc
        return held_policy(policy_doc, spec, share[0],
                           self.pods.get(key) or child.pods_at_once(spec))

    def set_share(self, key: TjKey, budget: str, cores: float | None) -> None:
        with self.lock:
            if cores is None:
                self.shares.get(key, {}).pop(budget, None)
            else:
                self.shares.setdefault(key, {})[budget] = cores

    def set_suspended(self, key: TjKey, budget: str | None) -> None:
        with self.lock:
            if budget is None:
                self.suspended.pop(key, None)
            else:
                self.suspended[key] = budget

    def set_budget(self, key: TjKey, cores: float | None, use: float = 0.0) -> None:
        """A budget's last split (None: the budget is gone)."""
        with self.lock:
            if cores is None:
                self.budgets.pop(key, None)
            else:
                self.budgets[key] = (cores, use)

    def forget(self, key: TjKey) -> None:
        with self.lock:
            for table in (self.demand, self.floors, self.pods, self.use, self.answered,
                          self.reads, self.seen_until, self.shares, self.suspended,
                          self.priorities):
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


def millicores(value: float) -> int:
    """`value` cores in whole millicores, rounded down (past float noise)."""
    return math.floor(value * 1000 + 1e-6)
