"""Local mode end to end: real commands, real processes, real psutil and signals."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import signal
import subprocess
import sys
import time

import psutil
import pytest

from testing.helpers import wait_for
from testing.paths import HUNGRY
from throttledjob.sidecar.cpu import controller
from throttledjob.sidecar.summary import cpu_peak_bound


def run(throttledjob_cmd, args, tmp_path, **kwargs):
    report = tmp_path / "report.json"
    proc = subprocess.run([*throttledjob_cmd, "run", "--quiet", "--report", str(report), *args],
                          capture_output=True, text=True, timeout=120, **kwargs)
    return proc, (json.loads(report.read_text()) if report.exists() else None)


def test_exit_code_and_report_fields(throttledjob_cmd, tmp_path):
    proc, report = run(throttledjob_cmd, ["--", sys.executable, "-c", "raise SystemExit(3)"],
                       tmp_path)
    assert proc.returncode == 3 and report["exit_code"] == 3
    for key in ("wall_seconds", "cpu_peak_cores", "cpu_max_cores", "cpu_mean_cores",
                "controller"):
        assert key in report
    assert "levers_used" in report["controller"]


def test_a_hostile_progress_file_neither_stops_the_control_loop_nor_the_run(
        throttledjob_cmd, tmp_path):
    """The command writes a progress record whose steps are 1e400 (inf to JSON, which
    int() cannot take) into the shared directory: each cycle failed on it, the last one
    raised out of throttledjob run, the command's exit code and report lost."""
    code = ("import json, os, time\n"
            "open(os.path.join(os.environ['THROTTLEDJOB_DIR'], 'progress-1.json'), 'w')"
            ".write('{\"schema\": 1, \"pid\": 1, \"steps\": 1e400}')\n"
            "end = time.time() + 2.5\n"
            "while time.time() < end: pass\n")
    proc, report = run(throttledjob_cmd, ["--cpu-peak", "0.5", "--", sys.executable, "-c",
                                          code], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "control cycle failed" not in proc.stderr and report["exit_code"] == 0


def test_the_gpus_watched_are_the_ones_the_command_may_use(throttledjob_cmd, tmp_path):
    """A program that reports no step declares no GPU (only a process that steps writes
    a record): the command's CUDA_VISIBLE_DEVICES says which to watch. Two simulated
    boards, the second a point less busy."""
    def busiest(**env: str) -> float:
        proc, report = run(throttledjob_cmd, ["--gpu-backend", "fake", "--", sys.executable,
                                              "-c", "import time; time.sleep(2.5)"],
                           tmp_path, env={**os.environ, "THROTTLEDJOB_FAKE_GPUS": "2",
                                          "THROTTLEDJOB_FAKE_GPU_TRACE": "steady", **env})
        assert proc.returncode == 0, proc.stderr
        return report["gpu"]["utilization_percent"]["max"]

    assert busiest(CUDA_VISIBLE_DEVICES="1") == 94.0
    assert busiest(CUDA_VISIBLE_DEVICES="") == 95.0   # none said: every board


def test_killed_command_exits_128_plus_signal(throttledjob_cmd, tmp_path):
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    proc, _ = run(throttledjob_cmd, ["--", sys.executable, "-c", code], tmp_path)
    assert proc.returncode == 128 + signal.SIGKILL


def _kernel_quota_or_fail():
    """The kernel quota must be usable where the suite runs as root (CI): else skip."""
    from throttledjob.sidecar.cpu.cgroups.detection import detect

    found = detect()
    if not found:
        if os.environ.get("CI"):
            pytest.fail(f"no kernel CPU quota on this machine: {found.reason}")
        pytest.skip(f"no kernel CPU quota here: {found.reason}")
    return found


def _our_cgroups() -> set[str]:
    from throttledjob.sidecar.cpu.cgroups.local_quota import PREFIX

    found = _kernel_quota_or_fail()
    return {n for n in os.listdir(found.backend.parent) if n.startswith(PREFIX)}


def test_the_kernel_quota_is_the_default_and_holds_the_target(throttledjob_cmd, tmp_path):
    before = _our_cgroups()
    proc, report = run(throttledjob_cmd, ["--cpu-peak", "0.5", "--max-slowdown", "10", "--",
                                          *HUNGRY, "--units", "40"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert report["enforcement"] == "quota"
    assert report["controller"]["enforcer"].startswith("kernel quota (cgroup v")
    samples = report["cpu_recent_samples"]
    # The kernel holds every second, within its own slack (a plain 0.5-core quota read
    # up to 0.525 here: bench/quota_spread.py --cores 0.5).
    assert samples and max(samples) <= cpu_peak_bound(0.5), samples
    assert report["controller"]["levers_used"] == ["quota"]
    # Held back, as the kernel's throttling counters say (2 busy workers at 0.5 cores).
    assert report["controller"]["signal_paused_seconds"] > 0
    assert report["controller"]["estimated_slowdown"] > 1.2
    k = report["controller"]["kernel_throttling"]  # the kernel's own counters, cpu.stat
    assert 0 < k["throttled_periods"] <= k["periods"] and k["throttled_seconds"] > 0
    assert _our_cgroups() <= before  # its cgroup is gone


def test_without_a_kernel_quota_it_falls_back_to_signals_and_says_why():
    from throttledjob.contracts.policy import Enforcement, Policy
    from throttledjob.sidecar.cpu.cgroups.detection import detect
    from throttledjob.sidecar.cpu.enforcement import local_enforcer, local_plan
    from throttledjob.sidecar.cpu.enforcer import SignalEnforcer
    from throttledjob.sidecar.cpu.processes import ProcessTree

    # What detect() says on a machine whose cgroups we may not write (a read-only mount).
    found = detect(root="/nonexistent-cgroupfs")
    plan = local_plan(Policy(cpu_peak_cores=1.0), found)
    enforcer = local_enforcer(plan, ProcessTree(root_pid=os.getpid()), 1, found)
    assert isinstance(enforcer, SignalEnforcer) and plan.enforcement is Enforcement.BOTH
    assert plan.reason.startswith("signals and pacing (no kernel quota: ")
    assert len(plan.reason) < 200


def test_signals_hold_an_uncooperative_program_to_the_target(throttledjob_cmd, tmp_path):
    # A target far under what two busy workers take, even on a loaded machine.
    # (maxSlowdown 20: holding two busy workers to 0.3 cores pauses them 85% of the time.)
    proc, report = run(throttledjob_cmd, ["--cpu-peak", "0.3", "--max-slowdown", "20",
                                          "--enforcement", "signals", "--",
                                          *HUNGRY, "--units", "50"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    first, *rest = report["cpu_recent_samples"]
    assert rest and max(rest) <= 0.3 * 1.1
    assert first <= 0.3 + 0.15  # interpreter start-up and the fork of the workers
    # Held on average too. Not the run's whole mean (cpu_mean_cores): in a run this short
    # (3-5 samples) the unpaced first second moves it by 3-8% (0.323 on one CI run).
    assert sum(rest) / len(rest) <= 0.3 * 1.05
    assert report["controller"]["levers_used"] == ["signals"]
    assert report["controller"]["signal_paused_seconds"] > 0.0


def test_cooperative_pacing_holds_the_target(throttledjob_cmd, tmp_path):
    proc, report = run(throttledjob_cmd, ["--cpu-peak", "0.3", "--max-slowdown", "10",
                                          "--enforcement", "cooperative", "--",
                                          *HUNGRY, "--units", "50", "--cooperative"],
                       tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    # Pacing starts at the first step(): the first sample holds interpreter start-up and
    # forks, unpaced in this mode (Both and Quota cover it).
    _, *rest = report["cpu_recent_samples"]
    assert rest and max(rest) <= 0.3 * 1.1
    assert report["steps"] == 100
    levers = report["controller"]["levers_used"]
    assert "pacing" in levers and "signals" not in levers  # (the explorer may add threads)
    assert report["controller"]["signal_paused_seconds"] == 0.0


def test_cooperative_enforcement_of_a_program_that_never_steps_says_so(throttledjob_cmd,
                                                                        tmp_path):
    """Nothing paces a program that does not call step(): the run says so in one line
    (it held nothing, and said nothing)."""
    proc, report = run(throttledjob_cmd, ["--cpu-peak", "0.3", "--enforcement",
                                          "cooperative", "--", *HUNGRY, "--units", "300"],
                       tmp_path)
    assert proc.returncode == 0 and report["steps"] == 0
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("throttledjob run: warning: enforcement cooperative, but the "
                           "command reported no step"), line


def test_workload_under_target_is_left_alone(throttledjob_cmd, tmp_path):
    proc, report = run(throttledjob_cmd, ["--cpu-peak", "1.5", "--enforcement", "both", "--",
                                          *HUNGRY, "--workers", "1", "--units", "60",
                                          "--pattern", "light"], tmp_path)
    assert proc.returncode == 0
    assert report["controller"]["paused_seconds"] == 0.0
    assert report["controller"]["levers_used"] == []


def test_slowdown_budget_is_never_exceeded(throttledjob_cmd, tmp_path):
    # Several control intervals (about 7 s): in a 3-second run the budget was exhausted
    # in 2 of 3 runs only, the first intervals earning the pause budget it then spends.
    proc, report = run(throttledjob_cmd, ["--cpu-peak", "0.5", "--max-slowdown", "1.25",
                                          "--enforcement", "signals", "--",
                                          *HUNGRY, "--units", "600"], tmp_path)
    assert proc.returncode == 0
    assert report["controller"]["estimated_slowdown"] <= 1.25 * 1.02
    # Held back by the budget from its first intervals to the end (it once read 0 s, the
    # enforcer's flag flickering), and that did not wind the quota down (0.25-0.34 then).
    # One interval's step down is left room: with a busy process beside the suite the
    # flag flickered for one interval (0.441, one MAX_STEP under the setpoint).
    assert report["controller"]["budget_exhausted_seconds"] >= report["wall_seconds"] / 2
    setpoint = 0.5 * (1 - controller.DEFAULT_MARGIN)
    assert report["controller"]["final_quota_cores"] >= setpoint * (1 - controller.MAX_STEP) - 1e-3
    assert report["cpu_peak_cores"] > 0.5  # the target is out of reach within the budget


BUSY_UNTIL_TERM = """
import signal, sys, time
def stop(sig, frame):
    open(sys.argv[1], "w").write("got SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(sys.argv[2], "w").write("started")
while True:
    pass
"""


@pytest.fixture
def start_until_stopped(throttledjob_cmd):
    """Start `throttledjob run` holding a command hard; returns (tool, command) once the
    command is stopped. Whatever the test's outcome, nothing is left running or stopped."""
    tools: list[subprocess.Popen] = []
    sessions: set[int] = set()

    def start(code: str, started, *args):
        tool = subprocess.Popen([*throttledjob_cmd, "run", "--quiet", "--cpu-peak", "0.1",
                                 "--max-slowdown", "20", "--enforcement", "signals", "--",
                                 sys.executable, "-c", code, *map(str, args)])
        tools.append(tool)
        wait_for(started.exists, what="the command to start")
        child = psutil.Process(tool.pid).children()[0]
        sessions.add(child.pid)  # the command leads a session of its own
        wait_for(lambda: child.status() == psutil.STATUS_STOPPED,
                 what="the command to be stopped")
        return tool, child

    yield start
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getsid(p.pid) in sessions:
                p.resume()
                p.kill()
    for tool in tools:
        tool.kill()
        tool.wait()


def test_sigterm_reaches_the_command_and_nothing_is_left(start_until_stopped, tmp_path):
    got, started = tmp_path / "got", tmp_path / "started"
    tool, child = start_until_stopped(BUSY_UNTIL_TERM, started, got, started)
    tool.send_signal(signal.SIGTERM)
    assert tool.wait(timeout=20) == 0
    assert got.read_text() == "got SIGTERM"
    assert not psutil.pid_exists(child.pid)


BUSY_THEN_DONE = """
import sys, time
open(sys.argv[1], "w").write("started")
end = time.process_time() + 1.5
while time.process_time() < end:
    pass
open(sys.argv[2], "w").write("done")
"""


def test_sigkill_of_the_tool_never_leaves_the_command_stopped(start_until_stopped, tmp_path):
    started, done = tmp_path / "started", tmp_path / "done"
    tool, _ = start_until_stopped(BUSY_THEN_DONE, started, started, done)
    tool.kill()  # at the worst moment: the command is stopped
    tool.wait()
    wait_for(done.exists, timeout=20, what="the command to resume and finish")


def test_sigkill_of_the_tool_never_leaves_descendants_stopped(start_until_stopped, tmp_path):
    # The busy process is a grandchild: only the guardian can resume it.
    started, done = tmp_path / "started", tmp_path / "done"
    shell = ("import subprocess, sys; subprocess.run([sys.executable, '-c', sys.argv[1], "
             "sys.argv[2], sys.argv[3]])")
    tool, child = start_until_stopped(shell, started, BUSY_THEN_DONE, started, done)
    grandchild = child.children()[0]
    wait_for(lambda: grandchild.status() == psutil.STATUS_STOPPED, what="grandchild stopped")
    tool.kill()
    tool.wait()
    wait_for(done.exists, timeout=20, what="the grandchild to resume and finish")


@pytest.mark.parametrize("args, fragment", [
    (["--cpu-peak", "0", "--", "touch", "{marker}"], "--cpu-peak"),
    (["--cpu-peak", "abc", "--", "touch", "{marker}"], "--cpu-peak"),
    (["--cpu-peak", "-1", "--", "touch", "{marker}"], "--cpu-peak"),
    (["--max-slowdown", "0.5", "--", "touch", "{marker}"], "--max-slowdown"),
    (["--interval", "0", "--", "touch", "{marker}"], "--interval"),
    (["--frobnicate", "--", "touch", "{marker}"],
     "throttledjob run: error: unrecognized arguments: --frobnicate"),
    (["--mode", "wild", "--", "touch", "{marker}"], "--mode"),
    (["--cpu-peak", "1"], "missing command"),
    (["--policy", "{missing}", "--", "touch", "{marker}"], "cannot read policy file"),
    (["--policy", "{bad}", "--", "touch", "{marker}"], "unknown field 'cpu'"),
    # A file's field is named as the file spells it, not as the flag that would set it.
    (["--policy", "{slow}", "--", "touch", "{marker}"], "slow.yaml: maxSlowdown=0.5 is out"),
    (["--report", "{nodir}/r.json", "--", "touch", "{marker}"], "--report"),
    # Found before the command runs, not after a run of hours (which read as "command not
    # found", exit 127, with the command's own result lost).
    (["--report", "{tmp}", "--", "touch", "{marker}"], "is a directory"),
    (["--report", "/proc/r.json", "--", "touch", "{marker}"], "cannot write in /proc"),
    (["--report", "", "--", "touch", "{marker}"], "--report: an empty path"),
    (["--metrics-port", "99999", "--", "touch", "{marker}"], "99999 is not a port"),
])
def test_bad_input_is_refused_in_one_line_before_starting(throttledjob_cmd, tmp_path, args,
                                                          fragment):
    marker = tmp_path / "marker"
    bad = tmp_path / "bad.yaml"
    bad.write_text("cpu: 1\n")
    (tmp_path / "slow.yaml").write_text("maxSlowdown: 0.5\n")
    fill = {"marker": str(marker), "missing": str(tmp_path / "nope.yaml"), "bad": str(bad),
            "slow": str(tmp_path / "slow.yaml"),
            "nodir": str(tmp_path / "no" / "such"), "tmp": str(tmp_path)}
    proc = subprocess.run([*throttledjob_cmd, "run", *[a.format(**fill) for a in args]],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], proc.stderr
    assert not marker.exists()


def test_a_power_target_under_an_idle_gpus_draw_is_refused_before_starting(
        throttledjob_cmd, tmp_path):
    """The simulated board idles at 72 W (5% busy): 50 W is out of any hold-back's reach,
    and the refusal says what the board draws; 100 W runs."""
    marker = tmp_path / "marker"
    env = {**os.environ, "THROTTLEDJOB_FAKE_GPU_TRACE": "idle"}

    def attempt(watts: str) -> subprocess.CompletedProcess:
        return subprocess.run([*throttledjob_cmd, "run", "--quiet", "--gpu-backend", "fake",
                               "--gpu-peak-power", watts, "--", "touch", str(marker)],
                              capture_output=True, text=True, timeout=30, env=env)

    refused = attempt("50")
    assert refused.returncode == 2 and not marker.exists()
    (line,) = refused.stderr.strip().splitlines()
    assert "--gpu-peak-power" in line and "idle draw (72 W)" in line, line
    assert attempt("100").returncode == 0 and marker.exists()


def test_unknown_command_exits_127(throttledjob_cmd, tmp_path):
    proc, _ = run(throttledjob_cmd, ["--", "no-such-command-xyz"], tmp_path)
    assert proc.returncode == 127
    assert proc.stderr.strip() == "throttledjob run: error: command not found: no-such-command-xyz"


def test_a_report_goes_through_a_symlink_and_to_stdout(throttledjob_cmd, tmp_path):
    """Written where a symlink points (not over the link), and to /dev/stdout as it is."""
    target = tmp_path / "runs" / "latest.json"
    target.parent.mkdir()
    target.write_text("{}")
    link = tmp_path / "report.json"
    link.symlink_to(target)
    proc = subprocess.run([*throttledjob_cmd, "run", "--quiet", "--report", str(link), "--",
                           "true"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and link.is_symlink()
    assert json.loads(target.read_text())["exit_code"] == 0
    proc = subprocess.run([*throttledjob_cmd, "run", "--quiet", "--report", "/dev/stdout",
                           "--", "true"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and json.loads(proc.stdout)["exit_code"] == 0


def test_a_file_that_is_no_program_exits_126_in_one_line(throttledjob_cmd, tmp_path):
    garbage = tmp_path / "garbage"
    garbage.write_text("not a program\n")
    garbage.chmod(0o755)
    proc, _ = run(throttledjob_cmd, ["--", str(garbage)], tmp_path)
    assert proc.returncode == 126
    assert proc.stderr.strip() == (f"throttledjob run: error: cannot run (Exec format "
                                   f"error): {garbage}")


def test_a_report_that_cannot_be_written_keeps_the_commands_exit_code(throttledjob_cmd,
                                                                       tmp_path):
    """The report's directory goes while the command runs: one line says so, and the exit
    code is still the command's (it read "command not found", 127)."""
    gone = tmp_path / "gone"
    gone.mkdir()
    proc = subprocess.run([*throttledjob_cmd, "run", "--quiet", "--report",
                           str(gone / "r.json"), "--", "sh", "-c", f"rm -r {gone}; exit 3"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"throttledjob run: error: --report: cannot write {gone}/r.json")


def started(pid: int) -> bool:
    """Whether `sleep 31.337` runs among the children of `pid`."""
    with contextlib.suppress(psutil.Error):
        return any("31.337" in c.cmdline() for c in psutil.Process(pid).children())
    return False


def test_a_ctrl_c_as_the_command_starts_reaches_it(throttledjob_cmd, tmp_path):
    """SIGINT the moment the command exists, before the handlers that forward it were in:
    it is held back and forwarded, never taken by us alone, which left the command
    running on unthrottled, orphaned, behind a KeyboardInterrupt traceback."""
    for _ in range(3):
        proc = subprocess.Popen([*throttledjob_cmd, "run", "--quiet", "--cpu-peak", "0.5",
                                 "--", "sleep", "31.337"], stderr=subprocess.PIPE, text=True)
        wait_for(lambda pid=proc.pid: started(pid), timeout=30, interval=0.001,
                 what="the command started")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        # Dead of SIGINT as the command is, as a calling shell expects (it shows 130).
        assert proc.returncode == -signal.SIGINT and "Traceback" not in err, err
        assert not [p for p in psutil.process_iter(["cmdline"])
                    if "31.337" in (p.info["cmdline"] or [])]


def test_ctrl_z_stops_the_command_with_us_and_fg_resumes_both(throttledjob_cmd, tmp_path):
    """Under the default kernel quota nothing of ours stops the command: SIGTSTP stopped
    only throttledjob, and the command ran on to its end meanwhile."""
    done = tmp_path / "done"
    proc = subprocess.Popen([*throttledjob_cmd, "run", "--quiet", "--cpu-peak", "1.5", "--",
                             sys.executable, "-c", "import time, sys; time.sleep(2.5); "
                             f"open({str(done)!r}, 'w')"])
    try:
        # As exec'd: a fork of ours not yet exec'd has our command line.
        (command,) = wait_for(lambda: [c for c in psutil.Process(proc.pid).children()
                                       if c.cmdline()[:2] == [sys.executable, "-c"]],
                              timeout=30, what="the command")
        proc.send_signal(signal.SIGTSTP)
        wait_for(lambda: command.status() == psutil.STATUS_STOPPED
                 and psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED, timeout=10,
                 what="the command and throttledjob stopped")
        time.sleep(3)   # longer than the command's own run: stopped, it cannot have ended
        assert not done.exists()
    finally:
        proc.send_signal(signal.SIGCONT)   # never left stopped, whatever failed above
    assert proc.wait(timeout=30) == 0 and done.exists()


def test_live_status_line_on_a_terminal(throttledjob_cmd):
    leader, follower = pty.openpty()
    proc = subprocess.Popen([*throttledjob_cmd, "run", "--cpu-peak", "0.5", "--",
                             *HUNGRY, "--workers", "1", "--units", "80"],
                            stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    output = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
    proc.wait(timeout=30)
    os.close(leader)
    assert b"throttledjob: cpu" in output and b"target 0.50" in output


def test_without_a_terminal_no_live_line_but_the_summary_and_q_silences_it(
        throttledjob_cmd, tmp_path):
    """A CI log or a batch script: no live status line, and the one-line summary at the
    end (what the run held, what it cost, with what); -q: nothing at all."""
    for quiet in ([], ["-q"]):
        proc = subprocess.run([*throttledjob_cmd, "run", *quiet, "--cpu-peak", "1", "--",
                               *HUNGRY, "--workers", "1", "--units", "60"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        if quiet:
            assert proc.stderr == ""
            continue
        (summary,) = proc.stderr.splitlines()
        assert summary.startswith("throttledjob run: ") and ", exit 0;" in summary, summary
        assert "against 1:" in summary and "x of 1.25x allowed" in summary, summary


def test_help_explains_every_subcommand(throttledjob_cmd):
    top = subprocess.run([*throttledjob_cmd, "--help"], capture_output=True, text=True)
    assert top.returncode == 0 and "run" in top.stdout
    sub = subprocess.run([*throttledjob_cmd, "run", "--help"], capture_output=True, text=True)
    assert "--cpu-peak" in sub.stdout and "--enforcement" in sub.stdout


def test_affinity_and_nice_levers_need_no_cooperation(throttledjob_cmd, tmp_path):
    policy = tmp_path / "p.yaml"
    policy.write_text("levers: {cpuAffinity: 1, nice: 5}\n")
    code = ("import os, time; time.sleep(0.3);"
            "print(len(os.sched_getaffinity(0)), os.nice(0))")
    out = subprocess.run([*throttledjob_cmd, "run", "--quiet", "--policy", str(policy), "--",
                          sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    cpus, niceness = map(int, out.stdout.split())
    assert niceness == 5
    assert cpus == (1 if len(os.sched_getaffinity(0)) > 1 else len(os.sched_getaffinity(0)))


def test_a_fifo_and_a_symlink_in_the_shared_directory_neither_hang_nor_mislead(
        throttledjob_cmd, tmp_path):
    """A command that leaves a FIFO named like a progress file (once: `run` hung for 20
    minutes after the command ended, deaf to SIGTERM) and a symlink to a file that is not
    ours: the run ends with the command and reports only real progress."""
    decoy = tmp_path / "decoy.json"
    decoy.write_text('{"schema": 1, "pid": 1, "steps": 1000000}')
    code = ("import os, sys; d = os.environ['THROTTLEDJOB_DIR']; "
            "os.mkfifo(os.path.join(d, 'progress-999999.json')); "
            "os.symlink(sys.argv[1], os.path.join(d, 'progress-1.json'))")
    started = time.monotonic()
    proc, report = run(throttledjob_cmd, ["--cpu-peak", "1", "--", sys.executable, "-c", code,
                                          str(decoy)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - started < 30
    assert report["steps"] == 0


def _kill_commands_marked(marker: str) -> None:
    """Whatever a failed test left: the commands it started (their command line holds
    `marker`), resumed and killed."""
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if marker in " ".join(p.info["cmdline"] or []):
                p.resume()
                p.kill()


USR_SIGNALS = """
import signal, sys, time
signal.signal(signal.SIGUSR1, lambda s, f: open(sys.argv[1], "a").write("usr1 "))
signal.signal(signal.SIGUSR2, lambda s, f: sys.exit(4))
open(sys.argv[2], "w").write("started")
while True:
    time.sleep(0.05)   # usr-signals-marker
"""


def test_sigusr1_and_sigusr2_reach_the_command_and_never_orphan_it(throttledjob_cmd,
                                                                    tmp_path):
    """SLURM and PyTorch Lightning ask a job to checkpoint with SIGUSR1: sent to us, it
    killed us (its default action) and left the command running on, orphaned."""
    got, started = tmp_path / "got", tmp_path / "started"
    proc = subprocess.Popen([*throttledjob_cmd, "run", "--quiet", "--", sys.executable, "-c",
                             USR_SIGNALS, str(got), str(started)])
    try:
        wait_for(started.exists, timeout=30, what="the command to start")
        proc.send_signal(signal.SIGUSR1)
        wait_for(lambda: got.exists() and "usr1" in got.read_text(), what="SIGUSR1 to arrive")
        assert proc.poll() is None
        proc.send_signal(signal.SIGUSR2)
        assert proc.wait(timeout=30) == 4
    finally:
        proc.kill()
        proc.wait()
        _kill_commands_marked("usr-signals-marker")


CLEAN_UP_ON_TERM = """
import signal, sys, time
def stop(sig, frame):
    start = time.monotonic()
    end = time.process_time() + 0.5
    while time.process_time() < end:   # a checkpoint: half a second of CPU
        pass
    open(sys.argv[1], "w").write(str(time.monotonic() - start))
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
open(sys.argv[2], "w").write("started")
while True:   # clean-up-marker
    pass
"""


@pytest.mark.parametrize("enforcement, sig", [("signals", signal.SIGTERM),
                                               ("signals", signal.SIGINT),
                                               ("quota", signal.SIGTERM)])
def test_a_command_asked_to_end_cleans_up_at_full_speed(throttledjob_cmd, tmp_path,
                                                        enforcement, sig):
    """After SIGTERM or Ctrl-C the command was held to its target through its clean-up
    (a checkpoint of 0.5 s of CPU took 10 s at 0.05 cores): as in a pod that terminates,
    throttling ends once the command is asked to end."""
    took, started = tmp_path / "took", tmp_path / "started"
    proc = subprocess.Popen([*throttledjob_cmd, "run", "--quiet", "--cpu-peak", "0.05",
                             "--max-slowdown", "40", "--enforcement", enforcement, "--",
                             sys.executable, "-c", CLEAN_UP_ON_TERM, str(took), str(started)])
    try:
        wait_for(started.exists, timeout=30, what="the command to start")
        time.sleep(2.5)   # held to the target by now
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0
        assert float(took.read_text()) < 4   # about 1 s on 2 busy cores
    finally:
        proc.kill()
        proc.wait()
        _kill_commands_marked("clean-up-marker")


def test_a_ctrl_c_stops_a_calling_shell_script_as_without_us(throttledjob_cmd):
    """bash ends a script on Ctrl-C only when its command died of SIGINT: we exited 130
    instead, so a sweep (`for lr in ...; do throttledjob run -- python train.py; done`)
    went on to its next run after each Ctrl-C."""
    script = '"$@"; echo after'
    shell = subprocess.Popen(["bash", "-c", script, "bash", *throttledjob_cmd, "run",
                              "--quiet", "--", "sleep", "31.338"],
                             start_new_session=True, stdout=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: [p for p in psutil.process_iter(["cmdline"])
                          if p.info["cmdline"] == ["sleep", "31.338"]],
                 timeout=30, what="the command started")
        os.killpg(shell.pid, signal.SIGINT)   # as a terminal sends it
        out, _ = shell.communicate(timeout=30)
        assert shell.returncode == -signal.SIGINT and out == "", out
    finally:
        with contextlib.suppress(OSError):
            os.killpg(shell.pid, signal.SIGKILL)
        shell.wait()
        _kill_commands_marked("31.338")


def test_an_empty_command_name_is_not_found_as_in_a_shell(throttledjob_cmd, tmp_path):
    proc, _ = run(throttledjob_cmd, ["--", ""], tmp_path)
    assert proc.returncode == 127
    assert proc.stderr.strip() == "throttledjob run: error: command not found: ''"
