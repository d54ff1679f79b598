"""Whether exploring the levers pays: the most a lever can save against the defaults, the
most the probes can cost, and the rule that weighs the two on a run of unknown length.

Pure functions of numbers (explorer.py asks them before it probes).
"""

from __future__ import annotations

from .lever_settings import MAX_PER_CORE_GAIN, LeverSetting, Pacing


def lever_gain_bound(candidates: list[LeverSetting], demand_cores: float,
                     target_cores: float, max_slowdown: float | None) -> float | None:
    """The most of the run's time any candidate can save against the defaults at the
    rate the budget gives them (at or under 0: none can win); None where no bound is
    known (a setting other than a thread count: stop pacing, a smaller batch).

    With a budget B the defaults, wanting D cores, run at max(min(D, T), D/B) cores. k
    threads do at most MAX_PER_CORE_GAIN times the defaults' steps per CPU-second on at
    most min(k, T) cores (lifted by the budget they match the defaults' D/B, no more).
    """
    rate = max(min(demand_cores, target_cores),
               demand_cores / max_slowdown if max_slowdown else 0.0)
    best = 0.0
    for c in candidates:
        if c.threads is None or c.batch_scale != 1.0 or c.pacing != Pacing.SLEEP:
            return None
        best = max(best, MAX_PER_CORE_GAIN * min(c.threads, target_cores))
    return 1.0 - rate / best if best else 0.0


def exploration_cost(exploration_seconds: float, demand_cores: float, target_cores: float,
                     max_slowdown: float | None) -> float:
    """The most an exploration of `exploration_seconds` can cost: its probes hold the
    target (the agent's probe hold), where the defaults run D/T times slower than unheld,
    instead of the budget's B: each second costs at most 1 - B*T/D of a second. Without
    a lift (no budget, or a target within it) holding the target is what the run does
    anyway: nothing."""
    if max_slowdown is None:
        return 0.0
    return exploration_seconds * max(
        0.0, 1.0 - max_slowdown * target_cores / max(1e-9, demand_cores))


# The least gain an exploration is assumed to bring where the bound says a lever brings
# less or none (MAX_PER_CORE_GAIN may be wrong for a workload: two threads on this
# machine busy with other work did 4.7x less per CPU-second than one): the probes then
# run once they cost at most 2% of the run's expected length, the "never more than 2%
# slower than a plain quota" goal (docs/dev/benchmarks.md).
INSURANCE_SHARE = 0.02


def worth_exploring(seconds: float, cost_seconds: float, gain: float | None) -> bool:
    """Whether an exploration costing `cost_seconds` pays for itself in a run that has
    stepped for `seconds`, where a lever can save at most `gain` of the time left.

    Nothing is known of the run's length but how long it has lasted, t: a run that has
    lasted t is as likely to end before 2t as after (Gott's rule), so t is what is
    expected to be left, and the exploration pays when t * gain >= its cost. A gain under
    2 * INSURANCE_SHARE counts as that much: the cost is then at most INSURANCE_SHARE of
    the run's expected length, 2t.
    """
    if gain is None or cost_seconds <= 0:
        return True
    return seconds * max(gain, 2 * INSURANCE_SHARE) >= cost_seconds
