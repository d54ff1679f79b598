"""A ThrottleBudget's spec read: the budget in force at a moment (its schedule and an
outside system's signal applied), and which ThrottledJobs its selector picks. Pure."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from .cpu_limits import cores


def cores_now(spec: Mapping[str, Any], now: datetime.datetime) -> tuple[float, str]:
    """The CPU budget (cores) at `now` (aware, UTC) and what set it (fraction_now)."""
    fraction, source = fraction_now(spec, now)
    return (cores((spec.get("cpu") or {}).get("peak")) or 0.0) * fraction, source


def watts_now(spec: Mapping[str, Any], now: datetime.datetime) -> float | None:
    """The GPU-watt budget at `now` (None: the budget has none)."""
    peak = (spec.get("gpu") or {}).get("peakWatts")
    return None if peak is None else float(peak) * fraction_now(spec, now)[0]


def fraction_now(spec: Mapping[str, Any], now: datetime.datetime) -> tuple[float, str]:
    """The part of its peaks the budget is at `now` and what set it: the spec (1), the
    lowest schedule window in force, or the signal, whichever is lowest."""
    best, source = 1.0, "spec"
    minute = now.hour * 60 + now.minute
    for w in spec.get("schedule") or []:
        if _in_window(minute, w["start"], w["end"]) and w["fraction"] < best:
            best, source = w["fraction"], f"schedule {w['start']}-{w['end']} UTC"
    signal = spec.get("signal")
    if signal and signal.get("fraction", 1.0) < best and _signal_holds(signal, now):
        best, source = signal["fraction"], "signal" + (
            f" until {signal['until']}" if signal.get("until") else "")
    return best, source


def _minutes(clock: str) -> int:
    hours, minutes = clock.split(":")
    return int(hours) * 60 + int(minutes)


def _in_window(minute: int, start: str, end: str) -> bool:
    a, b = _minutes(start), _minutes(end)
    return a <= minute < b if a <= b else (minute >= a or minute < b)


def _signal_holds(signal: Mapping[str, Any], now: datetime.datetime) -> bool:
    until = signal.get("until")
    if not until:
        return True
    return now < datetime.datetime.fromisoformat(until.replace("Z", "+00:00"))


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str] | None) -> bool:
    """Whether a label selector (matchLabels, matchExpressions) picks these labels; an
    empty or absent one picks all."""
    labels = labels or {}
    sel = selector or {}
    if any(labels.get(k) != v for k, v in (sel.get("matchLabels") or {}).items()):
        return False
    for e in sel.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {"In": key in labels and labels[key] in values,
              "NotIn": key not in labels or labels[key] not in values,
              "Exists": key in labels,
              "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True
