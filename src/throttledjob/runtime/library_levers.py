"""Apply thread caps and GPU memory fraction to the libraries the workload already uses.

Nothing here imports torch, numpy or threadpoolctl unless the workload has imported torch
or numpy itself: the runtime must stay free in a program that never uses them.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Any

log = logging.getLogger("throttledjob.runtime")


class ThreadCap:
    """Caps torch intra-op threads and BLAS/OpenMP pools; restores them when lifted."""

    def __init__(self) -> None:
        self.applied: int | None = None
        self._torch_default: int | None = None   # the workload's count before our cap
        self._torch_set: int | None = None       # the count our cap set
        self._pool_limiter: Any = None

    def apply(self, threads: int | None, force: bool = False) -> None:
        if threads == self.applied and not force:
            return
        torch = sys.modules.get("torch")
        settable = torch is not None and hasattr(torch, "set_num_threads")
        # The workload's own count is read at our first cap, not at torch's import (when
        # the levers are first applied): a script that sets its count after the import
        # (a DDP rank: 1) was "restored" to torch's default, 2 here, when a cap lifted,
        # and its OpenMP threads spun through every allreduce (its CPU a step 1.7x).
        current = torch.get_num_threads() if settable else None   # before the pools move
        if threads is not None and self._torch_default is None:
            self._torch_default = current
        # Pools first: threadpoolctl records the limits it will restore when it starts,
        # and torch's OpenMP pool is one of them, so torch must not be capped yet.
        self._apply_pools(threads)
        if settable and self._torch_default is not None:
            if threads is not None:
                # A cap never raises the count (a 1-thread rank probed at 4 would spin).
                self._torch_set = min(threads, self._torch_default)
                torch.set_num_threads(self._torch_set)
            else:
                # Lifted: the workload's count back, or the one it has set since our cap;
                # the next cap reads its count again.
                torch.set_num_threads(self._torch_default if current == self._torch_set
                                      else current)
                self._torch_default = self._torch_set = None
        self.applied = threads

    def _apply_pools(self, threads: int | None) -> None:
        if self._pool_limiter is not None:
            self._pool_limiter.restore_original_limits()
            self._pool_limiter = None
        if threads is None or not ({"numpy", "torch", "scipy"} & sys.modules.keys()):
            return
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:
            return
        self._pool_limiter = threadpool_limits(limits=threads)


def apply_gpu_memory_fraction(fraction: float | None) -> bool:
    """Cap the caching allocator of every visible CUDA device; True if it was applied."""
    torch = sys.modules.get("torch")
    if fraction is None or torch is None:
        return False
    try:
        if not torch.cuda.is_available():
            return False
        for device in range(torch.cuda.device_count()):
            torch.cuda.set_per_process_memory_fraction(fraction, device)
        return True
    except Exception as e:  # a lever must never break the job
        log.warning("throttledjob: could not set GPU memory fraction: %s", e)
        return False


def is_out_of_memory(error: BaseException) -> bool:
    """True for a CUDA out-of-memory error, recognised without importing torch."""
    return type(error).__name__ == "OutOfMemoryError" or "out of memory" in str(error).lower()


def free_gpu_cache() -> None:
    torch = sys.modules.get("torch")
    if torch is not None:
        with contextlib.suppress(Exception):
            torch.cuda.empty_cache()
