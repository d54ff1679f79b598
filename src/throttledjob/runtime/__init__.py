"""ThrottledJob runtime library: paces a workload to the sidecar's settings.

Standard library only; safe to import anywhere. Typical use in a training loop:

    from throttledjob import runtime as tj

    for batch in loader:
        loss = train_step(batch)
        tj.step()

With no sidecar (THROTTLEDJOB_DIR unset) every call is a no-op.
"""

from __future__ import annotations

import _thread  # built in, unlike threading: nothing to load at interpreter start
import atexit
import os
import sys

from throttledjob.contracts.names import ENV_DIR

# The injected auto-hook imports this package in every interpreter: typing costs ~6 ms
# there, so it is not imported (type checkers and ruff read this name as typing's).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from throttledjob.contracts.settings import Settings

    from .batching import BatchPlan
    from .client import Throttle

__all__ = ["BatchPlan", "Settings", "Throttle", "batch_plan", "batch_size", "default",
           "param", "retry_on_oom", "settings", "step"]

_default: Throttle | None = None
# Imported on first use, so that `import throttledjob.runtime` (done at every interpreter
# start by the injected auto-hook) costs next to nothing.
_LAZY = {"Throttle": ".client", "BatchPlan": ".batching",
         "Settings": "throttledjob.contracts.settings"}
# Held while the default Throttle is made: two threads' first step() made two.
_lock = _thread.allocate_lock()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def default() -> Throttle:
    """The process-wide Throttle, configured from the environment on first use. Thread-safe."""
    global _default
    if _default is None:
        with _lock:
            if _default is None:  # not made by another thread while this one waited
                from .client import Throttle

                throttle = Throttle()
                if throttle.enabled:
                    atexit.register(throttle.flush)
                    _flush_in_multiprocessing_children(throttle)
                _default = throttle
    return _default


def _new_lock_in_child() -> None:
    # A thread of the parent may have held it at the fork: it does not exist here.
    global _lock
    _lock = _thread.allocate_lock()


os.register_at_fork(after_in_child=_new_lock_in_child)


def _flush_in_multiprocessing_children(throttle: Throttle) -> None:
    """multiprocessing workers leave through os._exit, skipping atexit: use its finalizers."""
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


# Pacing is on: load the client now, not in the first step(). A child forked while
# another thread was half-way through that import inherited the import's lock, held by a
# thread the child does not have, and hung in its first step(). Not when the injected
# start-up hook loads this package (in every interpreter, torch or not, before any thread
# runs): the client would cost ~25 ms at each start, and the torch hook loads it anyway.
if os.environ.get(ENV_DIR) and not getattr(sys, "_throttledjob_starting", False):
    from . import client  # noqa: F401
