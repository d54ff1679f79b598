"""Peak statistics over a run: p99 and max of 1-second samples, in bounded memory."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class PeakStats:
    """Running count, mean, max and quantiles of samples.

    Quantiles come from a histogram of `resolution`-wide bins, so memory grows with the
    range of values seen, not with the length of the run (a sidecar may run for weeks).
    """

    resolution: float = 0.005
    count: int = 0
    total: float = 0.0
    max: float = 0.0

    def __post_init__(self) -> None:
        self._bins: dict[int, int] = {}

    def add(self, value: float) -> None:
        if not math.isfinite(value):
            return
        value = max(0.0, value)
        self.count += 1
        self.total += value
        self.max = max(self.max, value)
        key = round(value / self.resolution)
        self._bins[key] = self._bins.get(key, 0) + 1

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def quantile(self, q: float) -> float:
        """The nearest-rank q-quantile (0 < q <= 1), accurate to `resolution`."""
        if not self.count:
            return 0.0
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for key in sorted(self._bins):
            seen += self._bins[key]
            if seen >= rank:
                return min(self.max, key * self.resolution)
        return self.max

    @property
    def p99(self) -> float:
        return self.quantile(0.99)
