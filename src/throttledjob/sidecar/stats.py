"""Peak statistics over a run: p99 and max of 1-second samples, in bounded memory.

`PeakTracker` is the single place where interval readings become 1-second samples and
peaks, for the CPU and each GPU series alike; /status and `--report` both read it.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable
from dataclasses import dataclass

# "Now", for a target: the last this many 1-second samples. Whether a target is met, and
# whether the slowdown budget stood in its way, are both judged over this window.
RECENT_SAMPLES = 60


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
        # The bin's upper edge: a quantile never reads under the samples it stands for
        # (a peak of 1.0515 shown as 1.05 looked within a 1.05 bound that it was not).
        key = math.ceil(value / self.resolution - 1e-9)
        self._bins[key] = self._bins.get(key, 0) + 1

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def quantile(self, q: float) -> float:
        """The nearest-rank q-quantile (0 < q <= 1): at most `resolution` over it, never
        under it, never over the largest sample."""
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


@dataclass(frozen=True)
class PeakSummary:
    """A tracker's figures at one instant (None: no 1-second sample yet)."""

    count: int = 0
    p99: float | None = None
    max: float | None = None
    # p99 of the recent samples: "is the target met now", apart from the start-up.
    recent_p99: float | None = None
    recent: tuple[float, ...] = ()  # oldest first


class PeakTracker:
    """The one rule for peaks, CPU and GPU alike: interval readings are averaged into
    1-second samples (whatever the control interval), kept over the run in a PeakStats
    and over the last `recent` samples for "is the target met now"."""

    def __init__(self, resolution: float = 0.005, recent: int = RECENT_SAMPLES) -> None:
        self.stats = PeakStats(resolution=resolution)
        self.recent: collections.deque[float] = collections.deque(maxlen=recent)
        self._amount = 0.0
        self._seconds = 0.0

    def add(self, amount: float, elapsed: float, valid: bool = True) -> None:
        """Add `amount` (rate x seconds) measured over `elapsed` seconds. A window is
        closed once it spans a second; it makes a sample only if `valid` (the series
        was readable at the close)."""
        self._amount += amount
        self._seconds += elapsed
        if self._seconds < 0.999:
            return
        if valid:
            value = self._amount / self._seconds
            self.stats.add(value)
            self.recent.append(value)
        self._amount = self._seconds = 0.0

    @property
    def count(self) -> int:
        return self.stats.count

    @property
    def p99(self) -> float:
        return self.stats.p99

    @property
    def max(self) -> float:
        return self.stats.max

    def summary(self) -> PeakSummary:
        if not self.stats.count:
            return PeakSummary(recent=tuple(self.recent))
        return PeakSummary(self.stats.count, self.stats.p99, self.stats.max,
                           nearest_rank(self.recent, 0.99), tuple(self.recent))


def nearest_rank(samples: Iterable[float], q: float) -> float | None:
    """The exact nearest-rank q-quantile of `samples` (None when there are none)."""
    values = sorted(samples)
    if not values:
        return None
    return values[max(0, math.ceil(q * len(values)) - 1)]


def round_or_none(value: float | None, digits: int = 3) -> float | None:
    """A figure as reported: rounded, or None where nothing was measured."""
    return None if value is None else round(value, digits)
