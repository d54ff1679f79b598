"""The policy's choices: mode, enforcement, hold and permission, and how each is spelled.

Apart from the policy itself so that other contracts (contracts/status.py) and the operator
can build their own string choices on `Choice` without the policy's table and parsing.
"""

from __future__ import annotations

from enum import Enum


class Choice(str, Enum):
    """A string choice that compares and prints as its value (StrEnum, on Python 3.10)."""

    def __str__(self) -> str:
        return self.value


class Mode(Choice):
    ADAPTIVE = "adaptive"  # the controller and explorer move the levers
    FIXED = "fixed"  # the levers stay as the policy sets them


class Enforcement(Choice):
    # The kernel's CPU quota (CFS bandwidth) on the workload's own cgroup holds the peak:
    # exact, no CPU of ours, nothing ever stopped; cooperative levers (threads, batch) are
    # still explored under it. Where no quota can be set, it falls back to BOTH (the
    # ladder, local and in a pod: sidecar/cpu/enforcement.py).
    QUOTA = "quota"
    COOPERATIVE = "cooperative"  # pacing by the runtime library at the workload's steps
    SIGNALS = "signals"  # SIGSTOP/SIGCONT duty cycling by the sidecar, for any program
    BOTH = "both"  # pacing while the workload calls step(), signals otherwise


class Hold(Choice):
    """What the slowdown budget may do to a target that would cost more than it allows."""

    SOFT = "soft"  # lift the target as far as maxSlowdown needs (status: BudgetExhausted)
    HARD = "hard"  # hold the target whatever the slowdown (a power or thermal limit)


class Permission(Choice):
    """Whether a privileged lever may be used: the ThrottledJob (or the command line)
    allows it; absent is Deny."""

    ALLOW = "allow"
    DENY = "deny"


MODES = tuple(m.value for m in Mode)
PERMISSIONS = tuple(p.value for p in Permission)
HOLDS = tuple(h.value for h in Hold)
ENFORCEMENTS = tuple(e.value for e in Enforcement)
