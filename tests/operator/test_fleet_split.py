"""The fleet budget's split (operator/fleet_split.py): pure, so each rule is checked on
members built to need it."""

from __future__ import annotations

import math
import random

import pytest

from throttledjob.operator.fleet_split import (
    Member,
    even_split,
    split,
    to_suspend,
)

SATURATING = (2.0,) * 30  # wants 2 cores every second
BURSTY = (2.0,) * 3 + (0.1,) * 27  # 2 cores one second in ten, idle between


def slowdown_at(demand: tuple[float, ...], share: float) -> float:
    return Member("m", demand, 0.1).slowdown(share)


def test_a_held_second_takes_its_demand_over_its_share():
    assert slowdown_at(SATURATING, 1.0) == pytest.approx(2.0)
    assert slowdown_at(BURSTY, 1.0) == pytest.approx((3 * 2 + 27) / 30)
    assert slowdown_at((), 0.5) == 1.0  # unmeasured: no figure to charge


def test_the_member_that_loses_least_is_held_hardest():
    members = [Member("saturating", SATURATING, 0.05), Member("bursty", BURSTY, 0.05)]
    ours, even = split(2.0, members), even_split(2.0, members)
    assert ours.total == pytest.approx(2.0)
    assert ours.of("bursty").cores < ours.of("saturating").cores
    assert sum(s.slowdown for s in ours.shares) < sum(s.slowdown for s in even.shares) - 0.1


def test_no_member_past_its_max_slowdown_while_another_can_give():
    tight = Member("tight", SATURATING, 0.05, max_slowdown=1.25)
    loose = Member("loose", SATURATING, 0.05)
    out = split(2.4, [tight, loose])
    # 2 cores at most 1.25x is 1.6 cores; an even split would give it 1.2 (1.67x).
    assert out.of("tight").cores == pytest.approx(1.6, abs=0.01)
    assert out.of("tight").within_budget
    assert out.total <= 2.4 + 1e-9


def test_where_the_budget_cannot_hold_every_slowdown_the_lowest_priority_gives():
    high = Member("high", SATURATING, 0.05, max_slowdown=1.25, priority=10)
    low = Member("low", SATURATING, 0.05, max_slowdown=1.25, priority=0)
    out = split(2.0, [low, high])
    assert out.of("high").within_budget and not out.of("low").within_budget
    assert out.of("low").cores == pytest.approx(0.4, abs=0.01)


def test_floors_over_the_budget_are_reported_not_broken_silently():
    out = split(1.0, [Member("a", SATURATING, 0.6), Member("b", SATURATING, 0.6)])
    assert not out.feasible and out.floor == pytest.approx(1.2)
    assert [s.cores for s in out.shares] == [0.6, 0.6]  # floors: never under them


def test_each_members_own_target_still_holds():
    out = split(4.0, [Member("capped", SATURATING, 0.05, cap=0.5),
                      Member("free", SATURATING, 0.05)])
    assert out.of("capped").cores == pytest.approx(0.5)
    assert out.of("free").cores == pytest.approx(3.5)  # what it left is the other's


def test_a_member_not_read_keeps_its_share_and_its_slack_is_not_handed_out():
    out = split(2.0, [Member("gone", (), 0.05, held=1.2), Member("here", SATURATING, 0.05)])
    assert out.of("gone").cores == 1.2
    assert out.of("here").cores == pytest.approx(0.8)


def test_an_unmeasured_member_starts_at_an_even_share():
    out = split(3.0, [Member("new", (), 0.05), Member("a", SATURATING, 0.05),
                      Member("b", SATURATING, 0.05)])
    assert out.of("new").cores == pytest.approx(1.0, abs=0.01)
    assert out.total == pytest.approx(3.0)


def test_unmeasured_floors_over_the_even_part_do_not_pass_the_budget():
    out = split(1.0, [Member("big", (), 0.9), Member("small", (), 0.05)])
    assert out.total <= 1.0 + 1e-9 and out.of("big").cores >= 0.9 - 1e-9


def test_the_split_never_passes_the_budget_nor_a_floor():
    rng = random.Random(7)
    for _ in range(200):
        members = [Member(f"m{i}", tuple(rng.uniform(0, 4) for _ in range(rng.randint(0, 20))),
                          floor=rng.uniform(0.01, 0.2),
                          cap=rng.choice([None, rng.uniform(0.2, 4)]),
                          max_slowdown=rng.choice([1.1, 1.5, float("inf")]),
                          priority=rng.randint(0, 2),
                          held=rng.choice([None] * 5 + [rng.uniform(0.1, 1)]))
                   for i in range(rng.randint(1, 12))]
        budget = rng.uniform(0.5, 20)
        out = split(budget, members)
        if out.feasible:
            assert out.total <= budget + 1e-6
        for m, s in zip(members, out.shares, strict=True):
            assert s.cores >= min(m.floor, m.held or m.floor) - 1e-9
            if m.cap is not None and m.held is None:
                assert s.cores <= max(m.floor, m.cap) + 1e-9


def test_where_the_floors_do_not_fit_the_lowest_priority_latest_made_is_suspended_first():
    members = [Member("old-low", SATURATING, 0.3, priority=0),
               Member("new-low", SATURATING, 0.3, priority=0),
               Member("high", SATURATING, 0.3, priority=5),
               Member("plain", SATURATING, 0.3, priority=-1)]
    made = {"old-low": "2026-12-07T10:00:00Z", "new-low": "2026-12-07T11:00:00Z",
            "high": "2026-12-07T12:00:00Z"}  # "plain" is not queued by Kueue
    assert to_suspend(1.2, members, made) == set()  # the floors fit: none
    assert to_suspend(0.9, members, made) == {"new-low"}
    assert to_suspend(0.6, members, made) == {"new-low", "old-low"}
    # Never one Kueue does not queue, even where suspending all the others falls short.
    assert to_suspend(0.1, members, made) == {"new-low", "old-low", "high"}
    # A member held at its share (not read this time) weighs its share, not its floor.
    held = [Member("a", (), 0.1, held=0.5, priority=1), Member("b", SATURATING, 0.3)]
    assert to_suspend(0.6, held, {"a": "1", "b": "2"}) == {"b"}


def test_a_members_slowdown_is_the_mean_over_its_seconds_at_any_share():
    """Member.slowdown (log time, for the split's thousands of calls) is the mean of
    max(1, x/share) over its seconds, whatever the demand and share."""
    rng = random.Random(3)
    for _ in range(200):
        demand = tuple(rng.choice([0.0, 0.5, 1.0, rng.uniform(0, 4)]) for _ in
                       range(rng.randint(0, 40)))
        share = rng.choice([0.0, 0.5, 1.0, rng.uniform(0, 4)])
        mean = (sum(max(1.0, x / share) for x in demand) / len(demand) if share > 0
                else math.inf) if demand else 1.0
        assert Member("m", demand, 0.1).slowdown(share) == pytest.approx(mean)
