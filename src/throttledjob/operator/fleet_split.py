"""One CPU budget held across many ThrottledJobs (a ThrottleBudget), split among them so
that the fleet loses the least progress.

What a member's share costs it is read from its own demand: the cores it would have used
each recent second (its use plus the time the kernel's quota held back, which the
sidecars measure without any help from the workload). A second in which the member
wanted x cores, held to s, takes max(1, x/s) seconds of work, so held to s its slowdown
is the mean of max(1, x/s) over those seconds. That figure does not rest on steps, so a
member that reports none is weighed as well as one that does, and it tells a job that
idles between bursts (which loses little to a cap on its bursts) from one that saturates
(which loses in full).

The split, in order:
1. every member gets its floor (what its pods hold back fully); where the floors alone
   pass the budget, the budget cannot be met and says so with the floor;
2. then, from the highest priority down, the share each needs to stay within its own
   maxSlowdown, as far as the budget goes (a class that does not fit whole is filled by
   the least progress lost, and its members that miss are named);
3. then the rest where it saves the most slowdown: the slowdown is convex in the share,
   so handing out small steps to the member each saves most is the least total;
4. what no member's demand can use is left as headroom, evenly, up to each one's own
   target (each member's own target still holds: the lower of the two).

A member not read this time (its sidecars did not answer) keeps the share it had, and
what it does not use is not handed to the others; a member not measured yet gets an even
share of what is left, up to its own target. Where even the floors pass the budget, a
budget may suspend its lowest-priority members (to_suspend) rather than break its peak.

Pure functions; the operator's budget pass (budget_pass.py) applies the shares.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# Shares are handed out in steps of this part of the budget (step 3): 2,000 steps keep a
# split of 200 members well under a millisecond a step.
STEPS = 2000
# A share this close to what a member needs counts as meeting its maxSlowdown.
EPSILON = 1e-9


@dataclass(frozen=True)
class Member:
    """One ThrottledJob under the budget, as the split sees it (all in cores, job-wide)."""

    name: str
    demand: tuple[float, ...]  # what it would have used each recent second; () unmeasured
    floor: float  # the least it may be held to
    cap: float | None = None  # its own CPU target, job-wide (None: none)
    max_slowdown: float = math.inf
    priority: int = 0  # the lowest is held hardest where the budget cannot be met
    held: float | None = None  # not read this time: keeps this share
    # The demand sorted, and the sums of its tails: slowdown() in log time, for the
    # split weighs each member thousands of times over hundreds of seconds of demand.
    _sorted: list[float] = field(init=False, repr=False, compare=False)
    _tails: list[float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        xs = sorted(self.demand)
        tails = [0.0] * (len(xs) + 1)
        for i in range(len(xs) - 1, -1, -1):
            tails[i] = tails[i + 1] + xs[i]
        object.__setattr__(self, "_sorted", xs)
        object.__setattr__(self, "_tails", tails)

    def slowdown(self, share: float) -> float:
        """Work that wanted `demand` cores each second, held to `share` cores: its wall
        time over the unheld wall time, the mean of max(1, x/share) over its seconds (the
        seconds that wanted no more than the share take one second each, the others
        x/share)."""
        if not self._sorted:
            return 1.0
        if share <= 0:
            return math.inf
        i = bisect.bisect_right(self._sorted, share)
        return (i + self._tails[i] / share) / len(self._sorted)


@dataclass(frozen=True)
class Share:
    name: str
    cores: float
    slowdown: float  # expected at this share, from its demand (1.0 unmeasured)
    within_budget: bool  # its slowdown within its own maxSlowdown


@dataclass(frozen=True)
class Split:
    shares: tuple[Share, ...]
    floor: float  # the members' floors summed (held members at their share)
    feasible: bool  # the floors fit under the budget

    def of(self, name: str) -> Share | None:
        return next((s for s in self.shares if s.name == name), None)

    @property
    def total(self) -> float:
        return sum(s.cores for s in self.shares)


def needed(m: Member, lo: float, hi: float) -> float:
    """The least share in [lo, hi] within the member's maxSlowdown (hi where none is)."""
    if m.slowdown(lo) <= m.max_slowdown + EPSILON:
        return lo
    if m.slowdown(hi) > m.max_slowdown + EPSILON:
        return hi
    for _ in range(50):  # bisection: the slowdown falls as the share grows
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if m.slowdown(mid) <= m.max_slowdown else (mid, hi)
    return hi


def split(budget: float, members: Sequence[Member]) -> Split:
    """The shares of `budget` cores among `members` (see the module's docstring)."""
    fixed = {m.name: m.held for m in members if m.held is not None}
    free = budget - sum(fixed.values())
    measured = [m for m in members if m.held is None and m.demand]
    unmeasured = [m for m in members if m.held is None and not m.demand]
    lo = {m.name: m.floor for m in measured + unmeasured}
    floor = sum(lo.values()) + sum(fixed.values())
    share = dict(lo)
    if floor > budget + EPSILON:
        return _result(members, share | fixed, floor, feasible=False)
    # Unmeasured: an even share of what is left, until their demand is known.
    even = free / max(1, len(measured) + len(unmeasured))
    for m in unmeasured:
        share[m.name] = max(m.floor, min(_cap(m), even))
    room = free - sum(share.values())
    if room < 0 and unmeasured:  # floors over the even part: the parts above floors shrink
        excess = sum(share[m.name] - m.floor for m in unmeasured)
        for m in unmeasured:
            share[m.name] = m.floor + (share[m.name] - m.floor) * max(0.0, 1 + room / excess)
        room = free - sum(share.values())
    hi = {m.name: max(lo[m.name], min(_cap(m), max(m.demand))) for m in measured}
    for priority in sorted({m.priority for m in measured}, reverse=True):
        cls = [m for m in measured if m.priority == priority]
        want = {m.name: needed(m, share[m.name], hi[m.name]) for m in cls}
        if sum(want[m.name] - share[m.name] for m in cls) <= room + EPSILON:
            for m in cls:
                room -= want[m.name] - share[m.name]
                share[m.name] = want[m.name]
        else:
            room = _fill(cls, share, want, room, budget / STEPS)
    room = _fill(measured, share, hi, room, budget / STEPS)
    _headroom(measured + unmeasured, share, room)
    return _result(members, share | fixed, floor, feasible=True)


def to_suspend(budget: float, members: Sequence[Member],
               suspendable: Mapping[str, str]) -> set[str]:
    """Where even the members' floors pass the budget, the members to suspend so that the
    others' fit: the lowest priority first and, within one, the latest made first (as
    Kueue preempts), until they fit. Only `suspendable` ones (name -> its creation time:
    those Kueue queues, whose Workload can be deactivated and later admitted again) may
    go; empty where the floors fit."""
    total = sum(m.floor if m.held is None else m.held for m in members)
    order = sorted(sorted((m for m in members if m.name in suspendable),
                          key=lambda m: (suspendable[m.name], m.name), reverse=True),
                   key=lambda m: m.priority)
    out: set[str] = set()
    for m in order:
        if total <= budget + EPSILON:
            break
        out.add(m.name)
        total -= m.floor if m.held is None else m.held
    return out


def even_split(budget: float, members: Sequence[Member]) -> Split:
    """The same budget, each member an even part of it (within its floor and target): the
    split a platform team makes by hand, which the benchmark weighs ours against."""
    share = {m.name: max(m.floor, min(_cap(m), budget / max(1, len(members))))
             for m in members}
    return _result(members, share, sum(m.floor for m in members),
                   feasible=sum(m.floor for m in members) <= budget + EPSILON)


def _cap(m: Member) -> float:
    return math.inf if m.cap is None else max(m.floor, m.cap)


def _fill(members: Sequence[Member], share: dict[str, float], upto: dict[str, float],
          room: float, step: float) -> float:
    """Hand out `room` in steps to the member each step saves the most slowdown, each up
    to `upto`; returns what is left."""
    def gain(m: Member) -> float:
        s = share[m.name]
        return m.slowdown(s) - m.slowdown(min(s + step, upto[m.name]))

    heap = [(-gain(m), i, m) for i, m in enumerate(members) if share[m.name] < upto[m.name]]
    heapq.heapify(heap)
    while heap and room > EPSILON:
        neg, i, m = heapq.heappop(heap)
        if -neg <= 0:
            break  # no step saves anything: the rest is headroom
        give = min(step, room, upto[m.name] - share[m.name])
        share[m.name] += give
        room -= give
        if share[m.name] < upto[m.name] - EPSILON:
            heapq.heappush(heap, (-gain(m), i, m))
    return room


def _headroom(members: Sequence[Member], share: dict[str, float], room: float) -> None:
    """`room` evenly among the members below their own target (water-filled)."""
    open_ = sorted((m for m in members if share[m.name] < _cap(m) - EPSILON),
                   key=lambda m: _cap(m) - share[m.name])
    for i, m in enumerate(open_):
        give = min(_cap(m) - share[m.name], room / (len(open_) - i))
        share[m.name] += give
        room -= give


def _result(members: Sequence[Member], share: dict[str, float], floor: float,
            feasible: bool) -> Split:
    out = []
    for m in members:
        s = share[m.name]
        slow = m.slowdown(s)
        out.append(Share(m.name, s, slow, slow <= m.max_slowdown + 1e-6))
    return Split(tuple(out), floor, feasible)
