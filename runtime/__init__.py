"""ThrottledJob runtime library: paces a workload to the sidecar's settings.

Standard library only; safe to import anywhere. Typical use in a training loop:

    from throttledjob import runtime as tj

    for batch in loader:
        loss = train_step(batch)
        tj.step()

With no sidecar (THROTTLEDJOB_DIR unset) every call is a no-op.
"""

from __future__ import annotations

import atexit
from typing import Any

from .batching import BatchPlan
from .client import Throttle
from .settings import Settings

__all__ = ["BatchPlan", "Settings", "Throttle", "batch_plan", "batch_size", "default",
           "param", "retry_on_oom", "settings", "step"]

_default: Throttle | None = None


def default() -> Throttle:
    """The process-wide Throttle, configured from the environment on first use."""
    global _default
    if _default is None:
        _default = Throttle()
        if _default.enabled:
            atexit.register(_default.flush)
    return _default


def step(n: int = 1) -> None:
    default().step(n)


def batch_size(default_size: int) -> int:
    return default().batch_size(default_size)


def batch_plan(effective: int) -> BatchPlan:
    return default().batch_plan(effective)


def param(name: str, default_value: Any, **bounds: Any) -> Any:
    return default().param(name, default_value, **bounds)


def retry_on_oom(fn, batch: int, **options: Any):
    return default().retry_on_oom(fn, batch, **options)


def settings() -> Settings:
    return default().settings
