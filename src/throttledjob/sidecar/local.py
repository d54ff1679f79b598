"""Local mode: `throttledjob run -- CMD`, the sidecar's loop around one command."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TextIO

from throttledjob.contracts.names import ENV_DIR
from throttledjob.contracts.policy import Enforcement, Policy
from throttledjob.runtime.files import write_json_atomic
from throttledjob.runtime.inject import pythonpath_with, write_library

from .agent import Agent
from .cgroups.detection import detect
from .cgroups.throttling import ThrottleStats
from .enforcement import Plan, local_enforcer, local_plan, without_kernel_quota
from .enforcer import Enforcer
from .loop import run_loop
from .processes import ProcessTree, resume
from .record import CycleResult
from .stats import round_or_none
from .summary import run_line, summarize

if TYPE_CHECKING:
    from .gpu import GpuAgent

# Signals that ask the command to end: throttling ends with them (_StandDown).
ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
# SIGUSR1/2 too: their default action killed us and orphaned the command, where a scheduler
# (SLURM, Lightning) meant it for the command, to checkpoint.
FORWARDED_SIGNALS = (*ENDING_SIGNALS, signal.SIGUSR1, signal.SIGUSR2)
# Held back while the command starts, with the forwarded ones (_spawn).
START_HELD_SIGNALS = (*FORWARDED_SIGNALS, signal.SIGTSTP)
_PR_SET_PDEATHSIG = 1


def run_local(cmd: list[str], policy: Policy, report_path: str | None = None,
              status_stream: TextIO | None = None, extra_env: dict[str, str] | None = None,
              gpu: GpuAgent | None = None, metrics_address: tuple[str, int] | None = None,
              inject: bool = False, die_of_sigint: bool = False,
              summary_stream: TextIO | None = None) -> int:
    """Run `cmd` under `policy`; returns its exit code (128+N when killed by signal N).

    With `metrics_address` (host, port) it serves /metrics and /status as the pod sidecar
    does; the port is bound before the command starts, so a taken port fails fast.
    `summary_stream`: where the one-line summary goes at the end (None: nowhere). With
    `die_of_sigint`, a command killed by SIGINT ends this process by SIGINT too, once all
    is done: a calling shell stops its script on a Ctrl-C only when its command died of it.
    """
    exporter = None
    if metrics_address:
        from .exporter import Exporter  # prometheus_client only when asked for

        exporter = Exporter(*metrics_address)
    settings_dir = tempfile.mkdtemp(prefix="throttledjob-")
    env = _environment(settings_dir, extra_env, inject)
    started = time.monotonic()
    proc = agent = guardian = None
    previous_handlers = {}
    stand_down = _StandDown()
    try:
        proc, tree, previous_handlers = _spawn(cmd, env, stand_down)
        found = detect() if policy.enforcement is Enforcement.QUOTA else None
        plan = local_plan(policy, found)
        enforcer = local_enforcer(plan, tree, proc.pid, found)
        guardian = _start_guardian(proc.pid, enforcer)
        agent = Agent(policy, tree, settings_dir, enforcer, gpu=gpu, plan=plan)
        if exporter:
            exporter.attach(agent, f"psutil: process tree of pid {proc.pid}").start()
        _start(agent, proc.pid)
        stand_down.attach(agent)
        loop_started, loop_cpu_started = time.monotonic(), _own_cpu_seconds()
        host = LocalHost(proc, status_stream)
        run_loop(agent, host)
        with contextlib.suppress(Exception):  # as run_loop: never the command's exit code
            agent.cycle()  # the last partial interval, for the statistics
        exit_code, killed_by = host.exit_code, host.killed_by
        loop_wall = time.monotonic() - loop_started
        loop_cpu = _own_cpu_seconds() - loop_cpu_started
    finally:
        stand_down.join()
        _clean_up(agent, exporter, proc, guardian, previous_handlers, settings_dir)
    if status_stream is not None:
        status_stream.write("\n" if _is_tty(status_stream) else "")
    result = stand_down.as_held(agent.result)
    if warning := uncooperative(result):
        sys.stderr.write(f"throttledjob run: warning: {warning}\n")
    if report_path:
        report = build_report(result, time.monotonic() - started, exit_code,
                              agent.choice.report(), gpu.report() if gpu else None)
        # The control loop's own cost in steady state, apart from start-up (imports, spawn).
        report["controller"]["loop_cpu_percent"] = round(
            100 * loop_cpu / max(1e-9, loop_wall), 3)
        try:   # the command's exit code stands whatever befalls the report
            write_report(report_path, report)
        except (OSError, ValueError) as e:
            sys.stderr.write(f"throttledjob run: error: --report: cannot write "
                             f"{report_path}: {getattr(e, 'strerror', None) or e}\n")
    if summary_stream is not None:
        with contextlib.suppress(OSError, ValueError):   # a closed stream ends nothing
            summary_stream.write(run_line(result, time.monotonic() - started, exit_code,
                                          report_path) + "\n")
    if die_of_sigint and killed_by == signal.SIGINT:
        _die_of(signal.SIGINT)
    return exit_code


def _die_of(sig: signal.Signals) -> None:
    """End this process by `sig`, as the command ended (returns only if it is blocked)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
    os.kill(os.getpid(), sig)


class _StandDown:
    """A signal that asks the command to end stands the agent down, as a pod's preStop
    does: a command that checkpoints on SIGTERM or Ctrl-C does so at full speed, not held
    to the target. From a thread: the signal may land inside a cycle, which holds the
    agent's lock."""

    def __init__(self) -> None:
        self.asked = False
        self._agent: Agent | None = None
        self._thread: threading.Thread | None = None
        # The policy and plan that held the command until then, for the report.
        self._held: tuple[Policy, Plan] | None = None

    def ask(self) -> None:
        self.asked = True
        if self._agent is not None and self._held is None:
            self._held = (self._agent.policy, self._agent.plan)
            self._thread = threading.Thread(target=self._agent.stand_down, daemon=True)
            self._thread.start()

    def attach(self, agent: Agent) -> None:
        """The agent, once it runs; asked before (as the command started), it stands down
        now."""
        self._agent = agent
        if self.asked and self._held is None:
            self._held = (agent.policy, agent.plan)
            agent.stand_down()

    def as_held(self, result: CycleResult) -> CycleResult:
        """`result` with the targets the command was held to, not the none it ended with."""
        if self._held is None:
            return result
        return replace(result, policy=self._held[0], plan=self._held[1])

    def join(self) -> None:
        """Before the agent closes and the shared directory goes."""
        if self._thread is not None:
            self._thread.join(timeout=10)


class CommandNotStarted(Exception):
    """The command could not be started; `exit_code` is a shell's (127: not found, 126:
    found but not runnable)."""

    def __init__(self, command: str, error: OSError) -> None:
        # An empty name: a shell's "command not found", not execvp's EACCES from PATH.
        not_found = isinstance(error, FileNotFoundError) or not command
        what = ("command not found" if not_found else "is a directory"
                if os.path.isdir(command) else "permission denied"
                if isinstance(error, PermissionError) else f"cannot run ({error.strerror})")
        super().__init__(f"{what}: {command!r}" if not command else f"{what}: {command}")
        self.exit_code = 127 if not_found else 126


def _spawn(cmd: list[str], env: dict[str, str], stand_down: _StandDown
           ) -> tuple[subprocess.Popen, ProcessTree, dict]:
    """Start the command, with our signals forwarded to it from the first instant: a
    Ctrl-C while it starts reaches it, never us alone (which orphaned it).

    It starts in a session of its own so that our death never orphans it into a SIGHUP,
    and with SIGCONT as its parent-death signal so that a SIGKILL of this process cannot
    leave it stopped. The forwarded signals are held back until the handlers are in;
    the command gets them as we had them."""
    on_death = _continue_on_parent_death()
    held = signal.pthread_sigmask(signal.SIG_BLOCK, START_HELD_SIGNALS)

    def in_child() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        if on_death:
            on_death()

    try:
        try:
            proc = subprocess.Popen(cmd, env=env, start_new_session=True,
                                    preexec_fn=in_child)
        except OSError as e:
            raise CommandNotStarted(cmd[0], e) from None
        tree = ProcessTree(root_pid=proc.pid)
        return proc, tree, _forward_signals(proc, tree, stand_down)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def write_report(path: str, report: dict[str, Any]) -> None:
    """The report, whole or not at all: a regular file (or none yet) is replaced by
    rename, through a symlink to where it points, keeping an existing file's mode; a
    device or a pipe (/dev/stdout) is written as it is."""
    if _written_as_is(path):
        with open(path, "w") as f:
            f.write(json.dumps(report, indent=2, allow_nan=False) + "\n")
        return
    real = os.path.realpath(path)
    mode = os.stat(real).st_mode & 0o777 if os.path.exists(real) else 0o666 & ~_umask()
    write_json_atomic(real, report, indent=2, mode=mode)


def _written_as_is(path: str) -> bool:
    """A device or a pipe (/dev/stdout), through any link: written as it is, never
    replaced by rename."""
    return os.path.exists(path) and not os.path.isfile(path)


def _umask() -> int:
    """The process's umask, read without setting it (os.umask sets it, for every thread)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def report_problem(path: str) -> str | None:
    """Why a report could not be written at `path` (checked before the command starts,
    not found after a run of hours), or None."""
    if not path:
        return "an empty path"
    if os.path.isdir(path):
        return f"{path} is a directory"
    if _written_as_is(path):
        return None
    directory = os.path.dirname(os.path.realpath(path))
    try:
        fd, probe = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    except OSError as e:
        return f"cannot write in {directory}: {e.strerror}"
    os.close(fd)
    os.unlink(probe)
    return None


def _environment(settings_dir: str, extra_env: dict[str, str] | None,
                 inject: bool) -> dict[str, str]:
    """The command's environment: ours, the shared directory, and with `inject` the torch
    auto-hook, loaded by any Python the command starts."""
    env = {**os.environ, **(extra_env or {}), ENV_DIR: settings_dir}
    if inject:
        lib = write_library(os.path.join(settings_dir, "lib"))
        env["PYTHONPATH"] = pythonpath_with(lib, env.get("PYTHONPATH"))
    return env


def _clean_up(agent: Agent | None, exporter: Any, proc: subprocess.Popen | None,
              guardian: subprocess.Popen | None, previous_handlers: dict,
              settings_dir: str) -> None:
    """Whatever happened: the agent closed (levers restored, nothing left stopped), the
    port released, the guardian ended, our signal handlers and the shared directory
    gone."""
    if agent:
        agent.close()
    if exporter:
        exporter.close()
    if proc is not None:
        _leave_nothing_stopped(proc)
    if guardian is not None:
        guardian.stdin.close()
        guardian.wait()
    for sig, handler in previous_handlers.items():
        signal.signal(sig, handler)
    shutil.rmtree(settings_dir, ignore_errors=True)


def _start(agent: Agent, pid: int) -> None:
    """Arm the agent; where the kernel quota was detected usable and then refused (a
    race, a limit), signals take over."""
    agent.start()
    error = agent.enforcer_error
    if agent.plan.kernel_quota and error:
        agent.set_policy(agent.policy, without_kernel_quota(f"the kernel quota failed: {error}"))
        agent.use_enforcer(local_enforcer(agent.plan, agent.tree, pid, None))


class LocalHost:
    """The command around the loop: it ends when the command exits; each cycle shows a
    status line on a terminal."""

    def __init__(self, proc: subprocess.Popen, status_stream: TextIO | None) -> None:
        self._wait = _exit_waiter(proc)
        self._stream = status_stream if status_stream is not None and _is_tty(
            status_stream) else None
        self.exit_code = 0
        self.killed_by: int | None = None   # the signal that killed the command

    def wait(self, timeout: float) -> bool:
        code = self._wait(timeout)
        if code is None:
            return False
        self.exit_code = 128 - code if code < 0 else code
        self.killed_by = -code if code < 0 else None
        return True

    def before_cycle(self) -> None:
        pass

    def after_cycle(self, result: CycleResult) -> None:
        if self._stream is not None:
            self._stream.write("\r" + status_line(result) + "\033[K")
            self._stream.flush()

    def cycle_failed(self, error: Exception, in_a_row: int) -> None:
        if in_a_row == 1:
            sys.stderr.write(f"throttledjob: control cycle failed, workload released: "
                             f"{error!r}\n")


def _exit_waiter(proc: subprocess.Popen):
    """A function waiting up to `timeout` seconds for `proc` to exit (its code, or None).

    Popen.wait(timeout) polls with growing sleeps, dozens of wake-ups a second; a pidfd
    lets the kernel wake us exactly when the command exits.
    """
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        pidfd = None

    def wait(timeout: float) -> int | None:
        if pidfd is None:
            try:
                return proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return None
        ready, _, _ = select.select([pidfd], [], [], timeout)
        if not ready:
            return None
        os.close(pidfd)
        return proc.wait()

    return wait


def status_line(result: CycleResult) -> str:
    last, policy = result.last, result.policy
    target = f"{policy.cpu_peak_cores:.2f}" if policy.cpu_peak_cores else "-"
    state = "over budget" if result.budget_exhausted_recently else (
        "throttling" if last.throttling else "under target")
    return (f"throttledjob: cpu {last.usage_cores:.2f} cores (target {target}, "
            f"p99 {result.cpu.p99 or 0.0:.2f}) | paused {last.pause_fraction:.0%} | {state}")


def uncooperative(result: CycleResult) -> str | None:
    """Why nothing held the target, where the run left it to a cooperation that never
    came: enforcement cooperative, and the command reported no step (it does not use the
    runtime library, nor torch under --inject). Else None."""
    target, peak = result.policy.cpu_peak_cores, result.cpu.p99 or 0.0
    if (result.plan.enforcement is not Enforcement.COOPERATIVE or result.last.steps
            or not target or peak <= target * 1.05):
        return None
    return (f"enforcement cooperative, but the command reported no step: nothing held its "
            f"CPU (p99 {peak:.2f} cores, target {target:g}); without the runtime library "
            "(or torch under --inject), use --enforcement quota, signals or both")


def build_report(result: CycleResult, wall: float, exit_code: int,
                 explorer: dict | None = None, gpu: dict | None = None) -> dict:
    """The --report JSON. The run's figures (peaks, time held back, slowdown, levers)
    come from sidecar/summary.py, as /status's do; `wall` is the command's own."""
    run = summarize(result)
    policy = result.policy
    total_cpu = _children_cpu_seconds()
    return {
        "exit_code": exit_code,
        "wall_seconds": round(wall, 3),
        "cpu_target_cores": policy.cpu_peak_cores,
        "cpu_peak_cores": round(result.cpu.p99 or 0.0, 3),
        "cpu_max_cores": round(result.cpu.max or 0.0, 3),
        "cpu_mean_cores": round(total_cpu / wall, 3) if wall > 0 else 0.0,
        "cpu_seconds": round(total_cpu, 3),
        "samples": result.cpu.count,
        # The last minute of 1-second samples, oldest first.
        "cpu_recent_samples": [round(c, 3) for c in result.cpu.recent],
        # Units of work reported through the runtime library (step() or the auto-hook).
        "steps": result.last.steps,
        "max_slowdown": policy.max_slowdown,
        "hold": policy.hold,
        "enforcement": result.plan.enforcement,
        "mode": policy.mode,
        "controller": {
            "levers_used": list(run.levers),
            "paused_seconds": round(run.paused_seconds, 3),
            "signal_paused_seconds": round(result.signal_paused_seconds, 3),
            "cooperative_paused_seconds": round(result.cooperative_paused_seconds, 3),
            # What the levers in force cost by themselves (slower steps, no pause).
            "lever_cost_seconds": round(result.lever_cost_seconds, 3),
            "estimated_slowdown": round(run.slowdown, 3),
            # Time run under lever settings whose own cost was never measured (the run
            # ended before the defaults were): over 0, the estimate is a lower bound.
            "lever_cost_unknown_seconds": round(result.lever_cost_unknown_seconds, 3),
            # The estimate's top: that time charged at the most its setting can cost, and
            # every setting at the most it can where the unthrottled rate was read held
            # back (Explorer.unthrottled_rate_high).
            "estimated_slowdown_high": round(run.slowdown_high, 3),
            # Wall time the explorer's probes held the target off the budget's books,
            # and the most CPU (cores) an interval of them used.
            "probe_seconds": round(result.probe_seconds, 3),
            "probe_max_cores": round_or_none(result.probe_max_cores),
            "budget_exhausted_seconds": round(result.budget_exhausted_seconds, 3),
            # Why, where the budget stood in a target's way at the end (decide.py).
            "budget_exhausted_reason": result.budget_reason,
            # The controller's last rate (the key's "quota" predates the word "rate").
            "final_quota_cores": round_or_none(result.controller_rate),
            # Which enforcer held the workload, and why that one (sidecar/enforcement.py).
            "enforcer": result.plan.reason,
            # The kernel quota's own counters (cpu.stat), where it held the workload.
            "kernel_throttling": _kernel_counters(result.kernel_throttling),
            # What the lever explorer measured and chose (None when it did not run).
            "explorer": explorer,
            # This tool's own CPU (start-up, sampling, control, signals), not the command's.
            "own_cpu_seconds": round(_own_cpu_seconds(), 3),
        },
        **({"gpu": gpu} if gpu is not None else {}),
    }


def _kernel_counters(k: ThrottleStats | None) -> dict | None:
    if k is None:
        return None
    return {"periods": k.nr_periods, "throttled_periods": k.nr_throttled,
            "throttled_seconds": round(k.throttled_seconds, 3)}


def _children_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _own_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _forward_signals(proc: subprocess.Popen, tree: ProcessTree,
                     stand_down: _StandDown) -> dict:
    def forward(sig, _frame):
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, sig)
        if sig in ENDING_SIGNALS:
            stand_down.ask()
        # A stopped process cannot act on the signal: wake the whole tree.
        resume(tree.pids())

    def suspend(_sig, _frame):
        # Ctrl-Z: the terminal's SIGTSTP reaches only us (the command has a session of its
        # own, where the kernel would drop a SIGTSTP to it): the command stops with us,
        # and goes on when we are continued (fg, SIGCONT).
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGSTOP)
        os.kill(os.getpid(), signal.SIGSTOP)
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGCONT)

    handlers = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    handlers[signal.SIGTSTP] = signal.signal(signal.SIGTSTP, suspend)
    return handlers


def _leave_nothing_stopped(proc: subprocess.Popen) -> None:
    """Resume the command's process group and wait for the command to end."""
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGCONT)
    if proc.poll() is None:
        # Leaving early (an error in this tool): fail open, the command runs on unthrottled
        # and we wait for it rather than orphan or kill it.
        proc.wait()


def _start_guardian(pgid: int, enforcer: Enforcer | None) -> subprocess.Popen | None:
    """A tiny shell that resumes the command's whole process group when we are gone.

    It blocks reading a pipe only we hold; when we exit, even by SIGKILL, the read ends
    and it sends SIGCONT to the group: the command's descendants, not only the command
    (which its parent-death signal covers), are never left stopped. Under a kernel quota
    it also lifts the quota and removes the cgroup, so nothing stays throttled.
    """
    release = enforcer.release_script() if enforcer else ""
    try:
        return subprocess.Popen(
            ["/bin/sh", "-c", 'read _ignored; kill -s CONT -- "-$1" 2>/dev/null; eval "$2"',
             "guardian", str(pgid), release], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return None


def _continue_on_parent_death():
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGCONT), 0, 0, 0)

    return preexec


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
