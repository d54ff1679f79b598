"""The `throttledjob` command: one entry point, one subcommand per component."""

from __future__ import annotations

import argparse
import os
import sys

from throttledjob import __version__

EXIT_USAGE = 2
EXIT_NOT_FOUND = 127


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error: 'throttledjob run: error: ...' and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="throttledjob", description=(
        "Shave the CPU and GPU peaks of batch and ML jobs to a target you set, "
        "at the least slowdown, and show what was done."))
    parser.add_argument("--version", action="version", version=f"throttledjob {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    run = sub.add_parser("run", help="run a command on this machine under a peak target",
                         description=(
                             "Run CMD, measure the CPU use of its whole process tree and hold "
                             "its peak to the target. Exits with CMD's exit code."),
                         epilog="example: throttledjob run --cpu-peak 1.5 -- python train.py")
    run.add_argument("--cpu-peak", metavar="CORES",
                     help="CPU peak target in cores (1.5) or as a Kubernetes quantity (1500m)")
    run.add_argument("--max-slowdown", type=float, metavar="RATIO",
                     help="never slow the command by more than this factor (default 1.25)")
    run.add_argument("--interval", type=float, metavar="SECONDS",
                     help="control interval (default 1)")
    run.add_argument("--mode", choices=["adaptive", "fixed"],
                     help="adaptive trims the quota by feedback; fixed holds it (default adaptive)")
    run.add_argument("--enforcement", choices=["cooperative", "signals", "both"],
                     help="cooperative: the runtime library paces step() calls; signals: "
                          "SIGSTOP/SIGCONT duty cycling of any program; both: cooperative "
                          "while the program calls step(), signals otherwise (default both)")
    run.add_argument("--policy", metavar="FILE",
                     help="a YAML policy (the spec.throttle of a ThrottledJob); flags override it")
    run.add_argument("--report", metavar="FILE", help="write a JSON report here at the end")
    run.add_argument("--quiet", action="store_true", help="no live status line")
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]",
                     help="the command to run")
    run.set_defaults(func=_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.func(args, parser)


def _fail(prog: str, message: str) -> int:
    sys.stderr.write(f"{prog}: error: {message}\n")
    return EXIT_USAGE


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    prog = "throttledjob run"
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        return _fail(prog, "missing command: throttledjob run [options] -- CMD [ARGS...]")
    try:
        from throttledjob.sidecar.policy import (
            Policy,
            PolicyError,
            load_policy_file,
            parse_cpu_quantity,
        )
    except ImportError as e:
        return _fail(prog, f"needs the sidecar extra ({e.name} is missing): "
                           "pip install 'throttledjob[sidecar]'")
    try:
        base = load_policy_file(args.policy) if args.policy else Policy(enforcement="both")
        policy = base.with_overrides(
            cpu_peak_cores=None if args.cpu_peak is None
            else parse_cpu_quantity(args.cpu_peak, "--cpu-peak"),
            max_slowdown=args.max_slowdown, interval_seconds=args.interval,
            mode=args.mode, enforcement=args.enforcement)
    except PolicyError as e:
        return _fail(prog, _flag_names(str(e)))
    if args.report and not os.path.isdir(os.path.dirname(os.path.abspath(args.report))):
        return _fail(prog, f"--report: directory of {args.report} does not exist")
    from throttledjob.sidecar.local import run_local

    try:
        return run_local(cmd, policy, report_path=args.report,
                         status_stream=None if args.quiet else sys.stderr)
    except FileNotFoundError:
        sys.stderr.write(f"{prog}: error: command not found: {cmd[0]}\n")
        return EXIT_NOT_FOUND
    except PermissionError:
        sys.stderr.write(f"{prog}: error: permission denied: {cmd[0]}\n")
        return 126


def _flag_names(message: str) -> str:
    """Name flags as the user typed them when a flag, not a file, was wrong."""
    return (message.replace("maxSlowdown", "--max-slowdown")
            .replace("intervalSeconds", "--interval"))
