"""The periodic ticks, without kopf timers: each one a reconcile pass with what it reads
(reconcile.py): the sidecars of Running ThrottledJobs every status interval, each
ThrottleBudget's split (budget_pass.py) as often, the Kueue
Workload of queued ones, and the child of every unfinished one every resync interval (a
level-triggered safety net for child events lost to an API failure or a restart).

kopf puts a finalizer on every object that has a timer or daemon, so a ThrottledJob could
not be deleted while the operator is down. One thread instead walks the ThrottledJobs
this process has seen (kopf's watch feeds `OperatorState.seen`, within the operator's
namespaces) and hands each one's pass to a pool.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

from . import metrics
from .budget_pass import budget_pass
from .conditions import Phase
from .pod_limits import TjKey
from .reconcile import read_queue, read_sidecars, resync_from_job
from .state import OperatorState

# Threads running ticks' passes. A pass holds one for at most the read deadline per pod,
# so a slow sidecar takes one thread, not the tick.
POLL_THREADS = 8

Read = Callable[[OperatorState, str, str, str | None], None]


def due(seen: Mapping[TjKey, tuple[str | None, str | None]], resync: bool,
        budgets: Iterable[TjKey] = ()) -> list[tuple[Read, str, str, str | None]]:
    """This tick's passes: (function, namespace, name, Job name); each ThrottleBudget's
    split (budget_pass.py) too."""
    work: list[tuple[Read, str, str, str | None]] = [
        (read_sidecars, ns, name, job) for (ns, name), (phase, job) in seen.items()
        if phase == Phase.RUNNING]
    # Waiting in Kueue's queue (or held by it): why, each tick.
    work += [(read_queue, ns, name, job) for (ns, name), (phase, job) in seen.items()
             if job and phase in (Phase.QUEUED, Phase.SUSPENDED)]
    work += [(budget_pass, ns, name, None) for ns, name in sorted(budgets)]
    if resync:
        work += [(resync_from_job, ns, name, job) for (ns, name), (phase, job) in seen.items()
                 if job and phase not in (Phase.SUCCEEDED, Phase.FAILED)]
    return work


def poll(state: OperatorState, logger: logging.Logger) -> None:
    """Every status interval: read_sidecars of Running ThrottledJobs; every resync
    interval: resync_from_job of unfinished ones.

    Each ThrottledJob's pass goes to the pool on its own and the tick does not wait for
    it: a slow pod (it may dribble its answer up to the read deadline) delays only its
    own ThrottledJob's status. A pass still running when its next is due is skipped, so a
    slow one never piles up in the pool."""
    settings = state.settings
    next_resync = time.monotonic() + settings.resync_seconds
    # Keys of the passes in flight; added by this thread, removed by the pool's (set.add
    # and set.discard are atomic).
    running: set[tuple[Read, str, str]] = set()
    with ThreadPoolExecutor(POLL_THREADS, thread_name_prefix="throttledjob-read") as pool:
        while not state.stop.wait(settings.status_interval_seconds):
            resync = time.monotonic() >= next_resync
            if resync:
                next_resync = time.monotonic() + settings.resync_seconds
            context = state.context or contextvars.copy_context()
            for fn, ns, name, job in due(dict(state.seen), resync, set(state.budgets)):
                key = (fn, ns, name)
                if key in running:
                    metrics.SKIPPED.inc()
                    continue
                running.add(key)
                future = pool.submit(context.copy().run, fn, state, ns, name, job)
                future.add_done_callback(partial(_finished, running, key, logger))


def _finished(running: set[tuple[Read, str, str]], key: tuple[Read, str, str],
              logger: logging.Logger, future: Future[None]) -> None:
    running.discard(key)
    error = future.exception()
    if error is not None:  # the next tick tries again
        fn, ns, name = key
        metrics.PERIODIC_FAILURES.labels(fn.__name__).inc()
        logger.warning("%s %s/%s: %s", fn.__name__, ns, name, str(error) or type(error).__name__)
