"""`throttledjob` as a user first meets it: a bare command prints what it can do (the
commands a user or the chart runs; the pod's internal ones not listed), and `run --help`
says its exit codes."""

from __future__ import annotations

import subprocess

from testing.paths import VENV_BIN


def throttledjob(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "throttledjob"), *args], capture_output=True,
                          text=True, timeout=60)


def test_a_bare_command_prints_help_with_the_users_commands_alone() -> None:
    bare = throttledjob()
    assert bare.returncode == 0 and bare.stderr == "", bare.stderr
    listed = {line.split()[0] for line in bare.stdout.splitlines()
              if line.startswith("    ") and line.split()}
    assert listed == {"run", "sidecar", "operator", "node"}, bare.stdout
    # Internal, still there for the pods that run them.
    assert throttledjob("guard", "--help").returncode == 0
    assert throttledjob("inject-lib", "--help").returncode == 0


def test_run_help_says_its_exit_codes_and_a_stray_flag_is_one_line() -> None:
    text = " ".join(throttledjob("run", "--help").stdout.split())
    assert "Exit codes: CMD's own; 128+N when CMD was killed by signal N" in text
    stray = throttledjob("--no-such-flag")
    assert stray.returncode == 2
    assert stray.stderr == "throttledjob: error: unrecognized arguments: --no-such-flag\n"
