"""One CPU target for the whole job (`spec.throttle.scope: Job`), split among its pods.

A data-parallel job ends every step in an allreduce, so its slowest rank sets the pace of
all. An even split of a job-wide target over uneven ranks makes the throttle itself the
straggler: the lighter ranks leave their share idle at the barrier. Here each running pod
gets a part of the target in proportion to its CPU cost of a step (its CPU over its
steps in the sidecar's last 10 s), so every rank can keep the same pace; a pod that
reports no steps is weighed by its measured use. Each part is at least the pod's floor.
The split moves by weight only once every rank's workload has run for the sidecar's 10 s:
before, each keeps its limit, unless the limits in force pass the target (a pod replaced
at its even share), which are then cut in proportion.

The kernel holds each part as the pod's CPU limit (in-place resize). The moves never let
the sum of the limits in force pass the target: a pod's limit counts at the larger of
what its spec asks and what the kubelet has applied (a deferred resize counts at its old
value), shrinks go first, and a grow takes only the room the others leave now. A pod
whose sidecar does not answer, or whose resize was refused, keeps its limit and its part
is not handed to the others.

Pure functions over pods and their sidecars' reports.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from throttledjob.contracts.status import PACE_WINDOW_SECONDS

from . import child, cpu_limits
from .api_names import DEFAULT_SCOPE
from .child import JOBSET_INDEX_LABEL

# No pod's part goes under this (cores), nor under its CPU requests: a limit under a
# request is refused, and a rank at a few millicores would only stall the others.
MIN_RANK_CORES = 0.05
# A move smaller than this share of a pod's limit is not worth a resize: use and step
# rates move a little every interval.
SPLIT_STEP = 0.1
# ...but while more than this share of the target is held by no rank, a grow into it is.
ROOM_LEFT = 0.02
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def job_scoped(spec: Mapping[str, Any]) -> bool:
    """Whether the ThrottledJob's targets hold the whole Job (scope Job)."""
    return ((spec.get("throttle") or {}).get("scope") or DEFAULT_SCOPE) == "Job"


def pod_target(spec: Mapping[str, Any], target: float | None) -> float | None:
    """The CPU target of one pod: the target itself, or under scope Job its even share,
    which each pod starts with until the split has measured the ranks."""
    if target is None or not job_scoped(spec):
        return target
    return target / child.pods_at_once(spec)


@dataclass(frozen=True)
class Rank:
    """One pod of the job as the split sees it."""

    name: str
    uid: str
    index: int | None  # the Indexed Job's completion index
    limit: float  # cores it may use now: the larger of its spec's and the applied limits
    floor: float
    use: float | None = None  # cores in the last interval; None: not read (not moved)
    steps_per_second: float | None = None
    peak: float | None = None  # p99 of its 1-second CPU samples, cores
    held: bool = False  # its resize was refused: it keeps its limit
    job: int | None = None  # a JobSet's pod: its Job's global index (JobSet's label)
    # CPU seconds a step over the sidecar's last 10 s (None: no step in them, or a
    # sidecar from before the field)
    cost: float | None = None
    # Every workload container has run for the sidecar's window: its figures are of its
    # work, not of its start (see settled()).
    settled: bool = True

    @property
    def movable(self) -> bool:
        return self.use is not None and not self.held


def rank_floor(containers: Sequence[Mapping[str, Any]]) -> float:
    """The least a pod of this template may get: its CPU requests, or MIN_RANK_CORES."""
    return max(MIN_RANK_CORES, cpu_limits.total_request({"containers": containers}) or 0.0)


def applied_limit(pod: Mapping[str, Any]) -> float | None:
    """The summed CPU limit of a pod's workload containers as it binds now: the larger of
    the spec's (a grow the kubelet has not applied yet) and the kubelet's (a shrink not
    applied yet, containerStatuses[].resources); None when a container has none."""
    spec = cpu_limits.total_limit(pod.get("spec") or {})
    names = {c.get("name") for c in (pod.get("spec") or {}).get("containers") or []}
    statuses = [s for s in (pod.get("status") or {}).get("containerStatuses") or []
                if s.get("name") in names]
    running = cpu_limits.total_limit({"containers": statuses}) if statuses else None
    if spec is None:
        return None
    return max(spec, running) if running is not None else spec


def settled(pod: Mapping[str, Any], now: float) -> bool:
    """Whether every workload container of the pod has been running for
    PACE_WINDOW_SECONDS at `now` (Unix seconds). Weighed while it starts, a rank reads
    its imports, or nothing (its sidecar up before it; a wait at the rendezvous): one DDP
    run's split squeezed each rank in turn to 0.1 core while it loaded torch, and its Job
    took 1.05x the even split's time. A status with no container state (not yet
    reported), a container that has ended and a start time that cannot be read do not
    hold the split. The age is the node's clock against the operator's; and a start
    longer than the window (a dataset read before the first step) is still weighed by
    its use once the window has passed."""
    names = {c.get("name") for c in (pod.get("spec") or {}).get("containers") or []}
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        state = status.get("state") or {}
        if status.get("name") not in names or not state or "terminated" in state:
            continue   # no state reported yet, or a container that has done its part
        started = (state.get("running") or {}).get("startedAt")
        if not started:
            return False   # waiting to start (behind the sidecar, or to restart)
        try:   # Kubernetes writes UTC as "...Z", which Python 3.10 does not parse
            since = datetime.datetime.fromisoformat(started.replace("Z", "+00:00"))
        except ValueError:
            continue   # unreadable: it does not hold the split
        if now - since.timestamp() < PACE_WINDOW_SECONDS:
            return False
    return True


def terminating(pod: Mapping[str, Any]) -> bool:
    """Being deleted: it runs on through its grace period, phase still Running."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def completion_index(pod: Mapping[str, Any]) -> int | None:
    meta = pod.get("metadata") or {}
    value = (meta.get("annotations") or {}).get(COMPLETION_INDEX)
    return _int(value) if value is not None else _label_int(pod, COMPLETION_INDEX)


def _label_int(pod: Mapping[str, Any], key: str) -> int | None:
    return _int(((pod.get("metadata") or {}).get("labels") or {}).get(key))


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value >= 0 else None


def ranks(pods: Sequence[Mapping[str, Any]], reports: Mapping[str, Mapping[str, Any]],
          floor: Callable[[Mapping[str, Any]], float], held: Sequence[str] = (),
          now: float | None = None) -> list[Rank]:
    """The Job's Pending and Running pods that have CPU limits, by completion index, with
    their sidecars' reports (by pod uid) where read; `floor`: the least a pod may get
    (rank_floor of its template); `held`: uids that keep their limit;
    `now` (Unix seconds): whether each has settled (None: every one has). A pod being
    deleted is not one: it keeps its limit through its grace period (never cut while it
    may save a checkpoint) and its share goes to the ranks that run, its replacement's
    among them; held, its share would be made up by cutting the ranks that run."""
    out = []
    for pod in pods:
        limit = applied_limit(pod)
        if (pod.get("status") or {}).get("phase") not in ("Pending", "Running") \
                or limit is None or terminating(pod):
            continue
        meta = pod.get("metadata") or {}
        uid = meta.get("uid", "")
        observed = (reports.get(uid) or {}).get("observed") or {}
        out.append(Rank(meta.get("name", ""), uid, completion_index(pod), limit, floor(pod),
                        _number(observed.get("cpuCores")) if uid in reports else None,
                        _number(observed.get("stepsPerSecond")),
                        _number(observed.get("cpuPeakCores")), uid in held,
                        _label_int(pod, JOBSET_INDEX_LABEL),
                        _number(observed.get("cpuSecondsPerStep")),
                        now is None or settled(pod, now)))
    return sorted(out, key=lambda r: (r.job or 0, r.index is None, r.index or 0, r.name))


def weights(ranks: Sequence[Rank]) -> list[float]:
    """Each movable rank's weight: its CPU cost of a step where every one reports steps,
    else its use. In lockstep the two agree: each rank does the same steps, so its use is
    its cost times the common pace. The cost is the sidecar's over its last 10 s; one
    interval's use over its pace (a sidecar from before that figure) swung by a third."""
    if all((r.cost or 0) > 0 for r in ranks):
        return [r.cost for r in ranks]  # type: ignore[misc]
    if all((r.steps_per_second or 0) > 0 for r in ranks):
        return [max(0.0, r.use or 0.0) / r.steps_per_second for r in ranks]  # type: ignore[operator]
    return [max(0.0, r.use or 0.0) for r in ranks]


def shares(target: float, ranks: Sequence[Rank]) -> dict[str, float]:
    """Each movable rank's part of the target (cores, by pod uid): what the others hold
    stays theirs, the rest goes by weights(), none under its floor. While a rank has not
    settled, none is weighed by its figures: each keeps its limit, or where the limits in
    force pass the target, each is cut in proportion to its limit."""
    movable = [r for r in ranks if r.movable]
    if not movable:
        return {}
    if all(r.settled for r in movable):
        weighed = weights(movable)
    elif sum(r.limit for r in ranks) > target:
        weighed = [r.limit for r in movable]
    else:
        return {}
    left = max(0.0, target - sum(r.limit for r in ranks if not r.movable))
    parts = cpu_limits.split(weighed, [r.floor for r in movable], left)
    # Millicores, rounded down: the sum never passes what was split.
    return {r.uid: int(p * 1000 + 1e-6) / 1000 for r, p in zip(movable, parts, strict=True)}


def moves(target: float, ranks: Sequence[Rank], wanted: Mapping[str, float],
          step: float = SPLIT_STEP) -> list[tuple[Rank, float]]:
    """The resizes to make, in order: every shrink, then the grows, each grow cut to the
    room the others leave at the limits in force (a shrink just asked for still counts at
    its old limit). A move within `step` of a pod's limit is left out, except a shrink
    while the limits in force pass the target (a cut target, a pod replaced at its even
    share) or while a grow past `step` is wanted: its room is the small shrinks' (a DDP
    rank pinned at 0.304 core wanted 0.354, the other's shrink from 0.695 to 0.645 was
    within the step, and the split stood 32 s at the rank's limit); and a grow while
    more than ROOM_LEFT of the target is held by no rank (one run's ranks held 0.957 of
    a core, a grow from 0.623 to 0.665 within the step)."""
    held = {r.uid: r.limit for r in ranks}
    growing = any(wanted[r.uid] > r.limit * (1 + step) for r in ranks if r.uid in wanted)
    shrink_step = 0.0 if growing or sum(held.values()) > target + 1e-9 else step
    grow_step = 0.0 if target - sum(held.values()) > ROOM_LEFT * target else step
    shrinks = [(r, wanted[r.uid]) for r in ranks
               if r.uid in wanted and wanted[r.uid] < r.limit * (1 - shrink_step)]
    out: list[tuple[Rank, float]] = list(shrinks)
    for r in ranks:
        if r.uid not in wanted or wanted[r.uid] <= r.limit * (1 + grow_step):
            continue
        # Millicores, rounded down (the epsilon only absorbs float noise, 1e-9 cores): a
        # room rounded to the nearest 1e-6 first read 0.2499996 as 0.25, and the limits
        # passed a target of 1.3499996 (found by test_the_sum_of_the_limits_in_force_...).
        room = target - sum(v for uid, v in held.items() if uid != r.uid)
        grow = int(min(wanted[r.uid], room) * 1000 + 1e-6) / 1000
        if grow > r.limit * (1 + grow_step):
            out.append((r, grow))
            held[r.uid] = grow
    return out


# The figures of status.ranks[] and status.jobWide (cores unless said): rank_status and
# job_wide fill them, and the CRD's schema of them is generated from here (crd_status.py).
RANK_FIGURES = {
    "limitCores": "its CPU limit in force: its share (cores)",
    "cpuCores": "its CPU use in the last control interval (cores)",
    "stepsPerSecond": "its pace, as its workload reports steps",
    "idleFraction": "the part of its share it left unused (waiting at a barrier, or for "
                    "input)",
}
JOB_WIDE_FIGURES = {
    "targetCores": "the job-wide CPU target (cores)",
    "limitCores": "the sum of the running pods' CPU limits in force, which the kernel "
                  "holds (cores)",
    "cpuCores": "the sum of the pods' CPU use in their last control interval (cores)",
    "cpuPeakCores": "the sum of each pod's p99 CPU: the job's peak when its ranks peak "
                    "together (cores)",
}


def rank_status(rank: Rank) -> dict[str, Any]:
    """One entry of the ThrottledJob's status.ranks."""
    idle = None
    if rank.use is not None and rank.limit > 0:
        idle = round(min(1.0, max(0.0, 1 - rank.use / rank.limit)), 3)
    return {"pod": rank.name, "index": rank.index,
            **({"job": rank.job} if rank.job is not None else {}),
            "limitCores": round(rank.limit, 3),
            "cpuCores": None if rank.use is None else round(rank.use, 3),
            "stepsPerSecond": None if rank.steps_per_second is None
            else round(rank.steps_per_second, 3),
            "idleFraction": idle}


def job_wide(target: float, ranks: Sequence[Rank]) -> dict[str, Any]:
    """status.jobWide: the job against its target (None where no pod gives a figure)."""
    def total(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return round(sum(known), 3) if known else None

    return {"targetCores": target, "limitCores": total([r.limit for r in ranks]),
            "cpuCores": total([r.use for r in ranks]),
            "cpuPeakCores": total([r.peak for r in ranks])}


def split_message(moved: Sequence[tuple[Rank, float]], ranks: Sequence[Rank]) -> str:
    """The event when the split moves: each rank's new part, and why."""
    new = {r.uid: v for r, v in moved}
    parts = ", ".join(f"{r.name} {new.get(r.uid, r.limit):g}" for r in ranks)
    return f"job-wide CPU split moved to each pod's cost of a step (cores): {parts}"
