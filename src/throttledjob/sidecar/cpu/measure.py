"""Measure: what one control interval saw of the workload, as one `Sample`.

The `Meter` keeps the counters an interval is measured against (the tree's CPU time, the
runtime's paused seconds per process, the steps each process reported, the enforcer's
and the containers' held-back time) and turns their deltas into rates. It reads; it
changes nothing (the agent's `act` does).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from throttledjob.contracts.progress import MAX_PROGRESS_FILES, Progress
from throttledjob.contracts.status import PACE_WINDOW_SECONDS
from throttledjob.runtime.progress_files import read_progress

from ..stats import PeakTracker
from .cgroups.container_quota import ContainerQuota
from .enforcer import Enforcer
from .processes import ProcessTree, alive, own_cpu_seconds


@dataclass(frozen=True)
class Pace:
    steps_per_second: float = 0.0
    cpu_seconds_per_step: float | None = None  # None: no step in the window


class PaceWindow:
    """Steps per second and CPU seconds per step over the last PACE_WINDOW_SECONDS,
    from the run's running counts; the cost over the part of the window after the run's
    first step."""

    def __init__(self, seconds: float = PACE_WINDOW_SECONDS) -> None:
        self.seconds = seconds
        self._points: collections.deque[tuple[float, int, float]] = collections.deque()
        self._pace = Pace()
        self._read: float | None = None   # the tree's CPU as last read
        self._cpu = 0.0                   # its rises since the first read, summed
        self._first_step_at: float | None = None   # the point that first counted steps

    def add(self, now: float, steps: int, cpu_seconds: float) -> Pace:
        points = self._points
        if points and now - points[-1][0] < 0.5:  # too close to the last to tell apart
            return self._pace
        # The tree's CPU is its members' now: one that exits takes its seconds with it.
        # Only the rises count, so a drop does not understate a cost for the whole window.
        self._cpu += max(0.0, cpu_seconds - self._read) if self._read is not None else 0.0
        self._read = cpu_seconds
        if self._first_step_at is None and points and steps > points[-1][1]:
            self._first_step_at = now
        points.append((now, steps, self._cpu))
        while len(points) > 2 and now - points[1][0] >= self.seconds:
            points.popleft()
        (t0, steps0, _) = points[0]
        if now > t0:
            self._pace = Pace(max(0, steps - steps0) / (now - t0), self._cost())
        return self._pace

    def _cost(self) -> float | None:
        """CPU seconds a step over the window; while the window still holds the time
        before the run's first step (its imports, its rendezvous), from the point that
        first counted steps. Charged to the steps, a DDP rank's start read 2-3x its cost
        for the window's length, the two ranks' costs alike, and a job-wide split that
        follows them held the even split 10 s longer. Only the start: a window opening
        mid-run on no step (slow steps, an eval phase) is read whole, as a start on a
        step boundary would read slow steps high (a 4-s step 1.3x)."""
        points = self._points
        start = points[0]
        if self._first_step_at is not None and start[0] < self._first_step_at:
            start = next(p for p in points if p[0] >= self._first_step_at)
        _, steps0, cpu0 = start
        _, steps, cpu = points[-1]
        return (cpu - cpu0) / (steps - steps0) if steps > steps0 else None


# Processes whose last count the meter keeps: past this, the dead ones no longer read
# are folded into one total (a pipeline that starts a stepping process per task would
# otherwise have its count stop at its 1,024th process).
MAX_STEP_PIDS = 4 * MAX_PROGRESS_FILES


@dataclass(frozen=True)
class Sample:
    """One control interval of the workload."""

    time: float                 # the agent's clock at the end of the interval
    elapsed: float              # seconds since the last sample
    cpu_seconds: float          # the tree's CPU time so far
    used_seconds: float         # CPU seconds used in the interval
    records: tuple[Progress, ...]  # the live processes that report steps
    steps: int                  # steps reported over the run, by every process
    new_steps: int              # of which in this interval
    cooperative_pause: float    # the share of the interval the runtime paced itself
    cooperative_capped: bool    # the runtime's budget refused a pause its rate wanted
    signal_pause: float         # the share the enforcer held the tree back
    enforcer_capped: bool       # the enforcer's budget refused a pause
    kernel_pause: float         # the share the containers' own CPU limit held it back
    # Cores the tree wanted at its busy moments, where a kernel quota (the enforcer's, or
    # in a pod the containers' limits) held it back in the interval (None: not held, or
    # not by the kernel).
    busy_width: float | None = None
    # The pace and the CPU cost of a step over the last PACE_WINDOW_SECONDS.
    pace: Pace = field(default_factory=Pace)

    @property
    def usage_cores(self) -> float:
        return self.used_seconds / self.elapsed

    @property
    def cooperating(self) -> list[int]:
        return [r.pid for r in self.records]

    @property
    def pause_fraction(self) -> float:
        """Held back by our actuators: pacing and the enforcer hold the same workload at
        the same time, so the larger counts, not the sum."""
        return min(1.0, max(self.cooperative_pause, self.signal_pause))

    @property
    def held_back(self) -> float:
        """Held back by anything: our actuators, or in a pod the containers' own limits
        (they hold the same workload at the same time: the larger counts)."""
        return max(self.pause_fraction, self.kernel_pause)

    @property
    def devices(self) -> list[str]:
        """The GPUs the cooperating processes see (CUDA_VISIBLE_DEVICES)."""
        return sorted({d for r in self.records for d in r.visible_devices})


@dataclass(frozen=True)
class ProgressClock:
    """The cooperating processes' clocks at their last writes of the steps."""

    time: float             # the latest write (Unix seconds)
    cpu_seconds: float      # the CPU they had used by then, summed (0: an older runtime)
    pids: frozenset[int]
    # The same processes' CPU now, at the sidecar's cycle: their own threads only, as
    # the runtime's clock in their records counts (read from /proc).
    cycle_cpu_seconds: float = 0.0


def progress_clock(records: tuple[Progress, ...]) -> ProgressClock:
    """The writers' clocks, read when the explorer needs them (not on every cycle)."""
    return ProgressClock(max((r.time for r in records), default=0.0),
                         sum(r.cpu_seconds for r in records), frozenset(r.pid for r in records),
                         sum(own_cpu_seconds(r.pid) or 0.0 for r in records))


def steps_in_interval(steps: float, before: ProgressClock, now: ProgressClock,
                      elapsed: float) -> float:
    """The steps of one control interval, from the `steps` counted between two writes.

    The runtime writes its count every half second, at a step, not at this cycle: counted
    per cycle, an interval read half or one and a half of its steps (a setting measured
    over two intervals read 25% slow). Their rate over the writers' own CPU clock, times
    the CPU the same processes used in the interval, is the interval's own; so is their
    rate over the wall clock while the work steps without a break, but a wait between the
    writes (a bursty loop idles between bursts) spread them thin: a 2-thread burst read
    40% fewer steps per CPU-second than it ran. The wall clock serves where the CPU clock
    cannot (an older runtime, a process come or gone between the writes)."""
    if (now.pids == before.pids and before.cpu_seconds > 0
            and now.cpu_seconds > before.cpu_seconds
            and now.cycle_cpu_seconds >= before.cycle_cpu_seconds > 0):
        return (steps / (now.cpu_seconds - before.cpu_seconds)
                * (now.cycle_cpu_seconds - before.cycle_cpu_seconds))
    if before.time and now.time > before.time:
        return steps / (now.time - before.time) * elapsed
    return steps


class Meter:
    def __init__(self, tree: ProcessTree, settings_dir: str, now: float,
                 container_quota: ContainerQuota | None = None) -> None:
        self.tree = tree
        self.settings_dir = settings_dir
        self.container_quota = container_quota
        self.started = now
        self._last_time = now
        self._last_cpu = tree.cpu_seconds()
        self._used = 0.0   # summed intervals: cpu_seconds
        self._pace = PaceWindow()
        self._steps_by_pid: dict[int, int] = {}
        self._retired_steps = 0   # of processes gone, their files no longer read
        self._last_steps = 0
        self._last_coop_paused: dict[int, float] = {}
        self._last_signal_paused = 0.0
        # Totals over the run, as measured (read by the run's summary).
        self.cooperative_paused_seconds = 0.0
        self.kernel_paused_seconds = 0.0
        self.cpu_peaks = PeakTracker()  # of 1-second samples, in cores
        self.last_step_time = -1e18  # when a step was last reported (never: long ago)

    def _retire(self, read: set[int]) -> None:
        """Fold the counts of processes gone whose files were not read (newer files
        pushed them out of the newest MAX_PROGRESS_FILES; their times never change, so
        they are not read again) into one total. A live process is kept: its next write
        brings its file back with its whole count."""
        for pid in [p for p in self._steps_by_pid if p not in read and not alive(p)]:
            self._retired_steps += self._steps_by_pid.pop(pid)

    def baseline(self) -> None:
        """What ran before the agent is not the agent's to count (the containers' quota
        counters of an earlier process)."""
        if self.container_quota:
            self.container_quota.refresh()

    @property
    def cpu_seconds(self) -> float:
        """The workload's CPU time while watched, a counter that never goes down: the
        tree's own sum drops when a process leaves it unreaped (its parent outside the
        tree: in a pod, a container that exits or restarts), which Prometheus read as a
        counter reset and rate() as a spike of the whole total."""
        return self._used

    def measure(self, now: float, enforcer: Enforcer | None) -> Sample:
        self.tree.refresh()
        cpu = self.tree.cpu_seconds()
        elapsed = max(1e-6, now - self._last_time)
        used = max(0.0, cpu - self._last_cpu)
        self._last_cpu, self._last_time = cpu, now
        self._used += used

        everyone = read_progress(self.settings_dir)
        for r in everyone:  # the count survives the process that made it
            self._steps_by_pid[r.pid] = max(r.steps, self._steps_by_pid.get(r.pid, 0))
        if len(self._steps_by_pid) > MAX_STEP_PIDS:
            self._retire({r.pid for r in everyone})
        records = tuple(r for r in everyone if alive(r.pid))
        steps = self._retired_steps + sum(self._steps_by_pid.values())
        new_steps, self._last_steps = steps - self._last_steps, steps
        if new_steps:
            self.last_step_time = now
        self.cpu_peaks.add(used, elapsed)
        coop_pause = self._cooperative_pause(records, elapsed)
        signal_paused = enforcer.paused_seconds if enforcer else 0.0
        signal_pause = (signal_paused - self._last_signal_paused) / elapsed
        self._last_signal_paused = signal_paused
        kernel_pause = self._container_quota_pause(elapsed)
        busy_width = None
        # The kernel's width assumes the tree ran all of each throttled period: where
        # pacing paused it more than the kernel held it, pacing's pauses inside those
        # periods dilute the width by their share (in a pod, a 2-thread loop paced to about
        # its 1-core limit read 1.1 cores), and usage over the pause (1.8) is the demand.
        if coop_pause <= max(signal_pause, kernel_pause):
            busy_width = enforcer.busy_width if enforcer and signal_pause > 0 else None
            if busy_width is None and kernel_pause > 0 and self.container_quota:
                busy_width = self.container_quota.busy_width
        return Sample(
            time=now, elapsed=elapsed, cpu_seconds=cpu, used_seconds=used, records=records,
            steps=steps, new_steps=new_steps, cooperative_pause=coop_pause,
            cooperative_capped=any(r.pause_capped for r in records),
            signal_pause=signal_pause,
            enforcer_capped=bool(enforcer and enforcer.pause_capped),
            kernel_pause=kernel_pause, busy_width=busy_width,
            pace=self._pace.add(now, steps, cpu),
        )

    def _cooperative_pause(self, records: tuple[Progress, ...], elapsed: float) -> float:
        deltas = []
        for r in records:
            before = self._last_coop_paused.get(r.pid, r.paused_seconds)
            deltas.append(max(0.0, r.paused_seconds - before))
        self._last_coop_paused = {r.pid: r.paused_seconds for r in records}
        self.cooperative_paused_seconds += max(deltas, default=0.0)
        return max(deltas, default=0.0) / elapsed

    def _container_quota_pause(self, elapsed: float) -> float:
        """The share of the interval the containers' kernel quota held the workload back
        (0 without one)."""
        if self.container_quota is None:
            return 0.0
        self.container_quota.refresh()
        paused = self.container_quota.paused_seconds
        pause = (paused - self.kernel_paused_seconds) / elapsed
        self.kernel_paused_seconds = paused
        return min(1.0, max(0.0, pause))
