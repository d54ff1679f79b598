"""The workload side of ThrottledJob: `Throttle.step()` and friends.

Without THROTTLEDJOB_DIR (plain `python train.py`) every call is a cheap no-op.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from throttledjob.contracts.names import ENV_DIR, ENV_DISABLE, ENV_ON_STALE
from throttledjob.contracts.progress import Progress
from throttledjob.contracts.settings import UNTHROTTLED, Settings

from .batching import BatchPlan, scaled_batch
from .budget import CpuBudget
from .library_levers import ThreadCap, apply_gpu_memory_fraction, free_gpu_cache, is_out_of_memory
from .params import Param
from .progress_files import count_fresh_peers, visible_devices, write_progress
from .settings_watch import SettingsWatcher

log = logging.getLogger("throttledjob.runtime")
T = TypeVar("T")
# A cooperating process that has not written progress for this long no longer shares
# the quota (it finished, or stopped calling step()).
PEER_MAX_AGE_SECONDS = 2.0
# Pace in pauses of at least this long (see CpuBudget.min_pause_seconds): on a 2-thread
# torch loop of 1 ms steps held to 1 core, pausing at every step took 44 s for work that
# 20 ms pauses did in 21 s (bench/zoo.py matmul --scale 0.5, docs/dev/frontier.md).
MIN_PAUSE_SECONDS = 0.02
# With that debt carried, a 30 ms burst keeps a 1-second window within 1.05 x the quota.
BURST_SECONDS = 0.03


class Throttle:
    """Reads the sidecar's settings and applies them at the workload's step boundaries."""

    def __init__(self, directory: str | None = None, on_stale: str | None = None,
                 check_interval: float = 0.25, progress_interval: float = 0.5) -> None:
        directory = directory if directory is not None else os.environ.get(ENV_DIR, "")
        self.enabled = bool(directory) and os.environ.get(ENV_DISABLE, "") not in ("1", "true")
        self.directory = directory
        self._oom_scale = 1.0
        self._settings = UNTHROTTLED
        self._threads = ThreadCap()
        self._memory_fraction: float | None = None
        self._progress_interval = progress_interval
        self._peers = 1
        self._last_batch: int | None = None
        self._start_counting()
        self._devices = visible_devices()
        self._params: dict[str, Param] = {}
        self._warned: set[str] = set()
        self._watcher = None
        if self.enabled:
            self._watcher = SettingsWatcher(directory, check_interval,
                                            on_stale or os.environ.get(ENV_ON_STALE, "open"))
            # A forked child inherits this object: it must count its own steps under its
            # own pid (its exit flushed the parent's 300 as its own), and pace its own CPU
            # clock, which starts again at zero. Weak: the hook outlives the Throttle.
            start_counting = weakref.WeakMethod(self._start_counting_in_child)
            os.register_at_fork(after_in_child=lambda: _call_if_alive(start_counting))

    def _start_counting(self) -> None:
        """The counts and clocks that belong to this process alone."""
        self.steps = 0
        self.oom_events = 0
        self._started = time.time()
        # The slowdown budget counts from start-up (import torch, loading data ran
        # unpaused), not from the first step: counted from the first step, a 2-core loop
        # held to 1 core ran its first second at 1.4 cores, its pauses capped.
        self._budget = CpuBudget(burst_seconds=BURST_SECONDS, min_pause_seconds=MIN_PAUSE_SECONDS,
                                 start_wall=time.monotonic())
        self._next_step_at = 0.0
        self._next_tick = 0.0
        # Tick quickly at first: processes of one job start together and must learn of
        # each other before they share the CPU quota.
        self._tick_gap = 0.05

    def _start_counting_in_child(self) -> None:
        self._start_counting()
        self._apply(self._settings)  # the quota on the new budget

    @property
    def settings(self) -> Settings:
        """The settings in force (refreshed by `step()`)."""
        return self._settings

    def step(self, n: int = 1) -> None:
        """Call once per unit of work (a batch, an optimizer step, a chunk)."""
        self.steps += n
        if not self.enabled:
            return
        now = time.monotonic()
        if now >= self._next_tick:
            self._tick(now)
        pause = 0.0
        if self._budget.rate_cores:
            pause = self._budget.pause_for(time.process_time(), now)
        rate = self._settings.rate_limit_per_second
        if rate:
            pause = max(pause, self._rate_pause(now, rate, n))
        if pause > 0.0:
            time.sleep(pause)
            self._budget.record_pause(pause)

    def batch_size(self, default: int) -> int:
        """The micro-batch size to use now for a loop whose normal batch is `default`."""
        self._last_batch = scaled_batch(default, self._settings.batch_scale * self._oom_scale)
        return self._last_batch

    def batch_plan(self, effective: int) -> BatchPlan:
        """Micro-batches that add up to `effective` samples (see BatchPlan)."""
        return BatchPlan(effective, self.batch_size(effective))

    def param(self, name: str, default: Any, low: float | None = None,
              high: float | None = None, choices: list | tuple | None = None) -> Any:
        """The live value of a declared tunable, validated against its type and bounds."""
        spec = self._params.get(name)
        if spec is None:
            spec = self._params[name] = Param(name, default, low, high,
                                              tuple(choices) if choices else None)
        value, problem = spec.resolve(self._settings.params.get(name))
        if problem:
            self._warn_once(problem)
        return value

    def retry_on_oom(self, fn: Callable[[int], T], batch: int, retries: int = 3,
                     backoff_seconds: float = 0.5) -> T:
        """Call `fn(micro_batch)`; on CUDA out-of-memory free the cache, halve the
        micro-batch and retry with exponential backoff. The smaller size sticks."""
        for attempt in range(retries + 1):
            try:
                return fn(self.batch_size(batch))
            except Exception as e:
                if not is_out_of_memory(e) or attempt == retries or self.batch_size(batch) == 1:
                    raise
                self.oom_events += 1
                free_gpu_cache()
                self._oom_scale /= 2
                log.warning("throttledjob: out of memory; retrying with micro-batch %d",
                            self.batch_size(batch))
                time.sleep(backoff_seconds * 2**attempt)
        raise AssertionError("unreachable")

    def refresh_levers(self) -> None:
        """Re-apply thread and memory caps (a library such as torch was just imported)."""
        if not self.enabled:
            return
        self._tick(time.monotonic())
        self._apply(self._settings, force=True)

    def flush(self) -> None:
        """Write the progress record now (at exit, so the last steps are counted)."""
        if self.enabled:
            self._tick(time.monotonic())

    def _tick(self, now: float) -> None:
        self._next_tick = now + self._tick_gap
        self._tick_gap = min(self._progress_interval, self._tick_gap * 2)
        assert self._watcher is not None
        wall = time.time()
        # Only a process that reports steps is a cooperating process: with a record at 0
        # steps (any process that imports torch: DataLoader workers), 2 spawned workers
        # cut the trainer's share of a 0.6-core quota to 0.15. Every pause is in a step.
        if self.steps > 0:
            self._write_progress(wall)
        settings = self._watcher.current()
        peers = count_fresh_peers(self.directory, wall, PEER_MAX_AGE_SECONDS)
        if settings is not self._settings or peers != self._peers:
            self._peers = peers
            self._apply(settings)

    def _write_progress(self, wall: float) -> None:
        try:
            write_progress(self.directory, Progress(
                pid=os.getpid(), steps=self.steps, time=wall, started=self._started,
                cpu_seconds=time.process_time(),
                paused_seconds=self._budget.paused_seconds,
                pause_capped=self._budget.pause_capped, batch_size=self._last_batch,
                oom_events=self.oom_events, visible_devices=self._devices))
        except OSError as e:  # a full or read-only directory must not stop the work
            self._warn_once(f"cannot write progress in {self.directory}: {e.strerror}")

    def _warn_once(self, problem: str) -> None:
        if problem not in self._warned:
            self._warned.add(problem)
            log.warning("throttledjob: %s", problem)

    def _apply(self, settings: Settings, force: bool = False) -> None:
        self._settings = settings
        quota = settings.cpu_quota_cores
        self._budget.set(quota / self._peers if quota else None,
                         None if settings.probing else settings.max_pause_fraction)
        self._threads.apply(settings.threads, force)
        if force or settings.gpu_memory_fraction != self._memory_fraction:
            self._memory_fraction = settings.gpu_memory_fraction
            apply_gpu_memory_fraction(settings.gpu_memory_fraction)

    def _rate_pause(self, now: float, rate: float, n: int) -> float:
        earliest = self._next_step_at
        self._next_step_at = max(now, earliest) + n / rate
        return max(0.0, earliest - now)


def _call_if_alive(method: weakref.WeakMethod) -> None:
    bound = method()
    if bound is not None:
        bound()
