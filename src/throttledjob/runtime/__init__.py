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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from throttledjob.contracts.settings import Settings

    from .batching import BatchPlan
    from .client import Throttle

__all__ = ["BatchPlan", "Settings", "Throttle", "batch_plan", "batch_size", "default",
           "param", "retry_on_oom", "settings", "step"]

_default: Throttle | None = None
# Imported on first use, so that `import throttledjob.runtime` (done at every interpreter
# start by the injected auto-hook) costs next to nothing.
_LAZY = {"Throttle": ".client", "BatchPlan": ".batching", "Settings": ".settings"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def default() -> Throttle:
    """The process-wide Throttle, configured from the environment on first use."""
    global _default
    if _default is None:
        from .client import Throttle

        _default = Throttle()
        if _default.enabled:
            atexit.register(_default.flush)
            _flush_in_multiprocessing_children(_default)
    return _default


def _flush_in_multiprocessing_children(throttle: Throttle) -> None:
    """multiprocessing workers leave through os._exit, skipping atexit: use its finalizers."""
    import sys

    util = sys.modules.get("multiprocessing.util")
    if util is not None:
        util.Finalize(throttle, throttle.flush, exitpriority=10)


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
