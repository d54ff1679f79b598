"""Adaptive micro-batches that keep the effective batch through gradient accumulation."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class BatchPlan:
    """Split an effective batch of `effective` samples into `steps` micro-batches.

    Scale each micro-batch's loss by `weight(s)` and step the optimizer once per plan:
    the gradient equals the one of the full batch.

        plan = tj.batch_plan(64)
        for s in plan.slices():
            (loss_fn(model(x[s]), y[s]) * plan.weight(s)).backward()
        optimizer.step()
    """

    effective: int
    micro: int

    @property
    def steps(self) -> int:
        return math.ceil(self.effective / self.micro)

    def slices(self) -> Iterator[slice]:
        for start in range(0, self.effective, self.micro):
            yield slice(start, min(start + self.micro, self.effective))

    def weight(self, s: slice) -> float:
        return (s.stop - s.start) / self.effective


def scaled_batch(default: int, scale: float) -> int:
    """The micro-batch size for `default` at `scale` (0 < scale <= 1), at least 1."""
    if default < 1:
        raise ValueError(f"batch size must be at least 1, got {default}")
    return max(1, min(default, round(default * scale)))
