"""Local mode: `throttledjob run -- CMD`, the sidecar's loop around one command."""

from __future__ import annotations

import contextlib
import ctypes
import os
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
from throttledjob.runtime.inject import pythonpath_with, write_library

from .agent import Agent
from .cpu.cgroups.detection import detect
from .cpu.enforcement import Plan, local_enforcer, local_plan, without_kernel_quota
from .cpu.enforcer import Enforcer
from .cpu.processes import ProcessTree, resume
from .local_host import LocalHost, is_tty
from .local_report import build_report, own_cpu_seconds, save_report
from .loop import run_loop
from .record import CycleResult
from .summary import run_line

if TYPE_CHECKING:
    from .exporter import Exporter
    from .gpu_agent import GpuAgent

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
    exporter = _open_exporter(metrics_address)
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
        host, loop_cpu_percent = _control_until_exit(agent, proc, status_stream)
    finally:
        stand_down.join()
        _clean_up(agent, exporter, proc, guardian, previous_handlers, settings_dir)
    if status_stream is not None:
        status_stream.write("\n" if is_tty(status_stream) else "")
    result = stand_down.as_held(agent.result)
    if warning := uncooperative(result):
        sys.stderr.write(f"throttledjob run: warning: {warning}\n")
    if report_path:
        report = build_report(result, time.monotonic() - started, host.exit_code,
                              agent.choice.report(), gpu.report() if gpu else None)
        report["controller"]["loop_cpu_percent"] = loop_cpu_percent
        save_report(report_path, report)
    if summary_stream is not None:
        with contextlib.suppress(OSError, ValueError):   # a closed stream ends nothing
            summary_stream.write(run_line(result, time.monotonic() - started, host.exit_code,
                                          report_path) + "\n")
    if die_of_sigint and host.killed_by == signal.SIGINT:
        _die_of(signal.SIGINT)
    return host.exit_code


def _open_exporter(metrics_address: tuple[str, int] | None) -> Exporter | None:
    """The /metrics and /status server, bound now (before the command starts), or None."""
    if not metrics_address:
        return None
    from .exporter import Exporter  # prometheus_client only when asked for

    return Exporter(*metrics_address)


def _control_until_exit(agent: Agent, proc: subprocess.Popen,
                        status_stream: TextIO | None) -> tuple[LocalHost, float]:
    """Run the control loop until the command exits: the host (its exit code) and the
    loop's own CPU in percent of its wall time, the steady-state cost apart from start-up
    (imports, spawn)."""
    loop_started, loop_cpu_started = time.monotonic(), own_cpu_seconds()
    host = LocalHost(proc, status_stream)
    run_loop(agent, host)
    with contextlib.suppress(Exception):  # as run_loop: never the command's exit code
        agent.cycle()  # the last partial interval, for the statistics
    loop_wall = time.monotonic() - loop_started
    loop_cpu = own_cpu_seconds() - loop_cpu_started
    return host, round(100 * loop_cpu / max(1e-9, loop_wall), 3)


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
