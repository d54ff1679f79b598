"""User-declared tunable parameters: typed, bounded, updated live through the settings file."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Param:
    """A tunable: its type follows `default` (int, float, bool or str)."""

    name: str
    default: Any
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.default, (int, float, str, bool)):
            raise TypeError(f"parameter {self.name!r}: default must be int, float, str or bool")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"parameter {self.name!r}: low {self.low} > high {self.high}")
        problem = self.check(self.default)
        if problem:
            raise ValueError(f"parameter {self.name!r}: default {problem}")

    def check(self, value: Any) -> str | None:
        """None if `value` is valid for this parameter, else why not."""
        kind = type(self.default)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if type(value) is not kind:
            return f"{value!r} is not of type {kind.__name__}"
        if kind is float and not math.isfinite(value):
            return f"{value!r} is not finite"
        if self.choices is not None and value not in self.choices:
            return f"{value!r} is not one of {list(self.choices)}"
        if self.low is not None and value < self.low:
            return f"{value!r} is below {self.low}"
        if self.high is not None and value > self.high:
            return f"{value!r} is above {self.high}"
        return None

    def resolve(self, value: Any) -> tuple[Any, str | None]:
        """The value to use for a live `value` (None: not set), and a problem if refused."""
        if value is None:
            return self.default, None
        problem = self.check(value)
        if problem:
            return self.default, f"parameter {self.name!r}: {problem}; using default"
        return (float(value) if isinstance(self.default, float) else value), None
