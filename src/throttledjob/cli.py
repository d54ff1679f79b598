"""The `throttledjob` command: one entry point, one subcommand per component."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from throttledjob import __version__
from throttledjob.contracts.choices import ENFORCEMENTS, MODES
from throttledjob.contracts.names import GPU_BACKENDS

EXIT_USAGE = 2
# `run`'s flags that set a policy field: an error in one names the flag, not the field.
RUN_FLAGS = {"max_slowdown": "--max-slowdown", "interval_seconds": "--interval",
             "gpu_peak_utilization_percent": "--gpu-peak-util",
             "gpu_peak_power_watts": "--gpu-peak-power",
             "gpu_memory_fraction": "--gpu-memory-fraction"}


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
    parser.set_defaults(func=_help)
    # In this order in --help; guard and inject-lib, added with no help, are not listed.
    for add in (_add_run, _add_sidecar, _add_guard, _add_operator, _add_node, _add_inject_lib):
        add(sub)
    for subparser in sub.choices.values():
        subparser.set_defaults(subparser=subparser)
    return parser


def _add_run(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run a command on this machine under a peak target",
                         description=(
                             "Run CMD, measure the CPU use of its whole process tree and hold "
                             "its peak to the target. Exits with CMD's exit code."),
                         epilog="example: throttledjob run --cpu-peak 1.5 -- python train.py. "
                                "Exit codes: CMD's own; 128+N when CMD was killed by signal "
                                "N; 2: a usage error (nothing run); 126: CMD could not be "
                                "run; 127: CMD not found.")
    run.add_argument("--cpu-peak", metavar="CORES",
                     help="CPU peak target in cores (1.5) or as a Kubernetes quantity (1500m)")
    run.add_argument("--max-slowdown", type=float, metavar="RATIO",
                     help="never slow the command by more than this factor (default 1.25)")
    run.add_argument("--hard", action="store_true",
                     help="a hard target: held whatever the slowdown (a power or thermal "
                          "limit); --max-slowdown is then not applied")
    run.add_argument("--interval", type=float, metavar="SECONDS",
                     help="control interval (default 1)")
    run.add_argument("--mode", choices=MODES,
                     help="adaptive trims the quota by feedback; fixed holds it (default adaptive)")
    run.add_argument("--enforcement", choices=ENFORCEMENTS,
                     help="quota: the kernel's CPU quota on the command's own cgroup, "
                          "falling back to both where the machine allows none (the report "
                          "says which ran and why); cooperative: the runtime library paces "
                          "step() calls; signals: SIGSTOP/SIGCONT duty cycling of any "
                          "program; both: cooperative while the program calls step(), "
                          "signals otherwise (default quota)")
    run.add_argument("--policy", metavar="FILE",
                     help="a YAML policy (the spec.throttle of a ThrottledJob); flags override it")
    run.add_argument("--gpu-peak-util", type=float, metavar="PERCENT",
                     help="GPU peak utilization target per GPU, in percent")
    run.add_argument("--gpu-peak-power", type=float, metavar="WATTS",
                     help="GPU peak power target per GPU, in watts")
    run.add_argument("--gpu-memory-fraction", type=float, metavar="FRACTION",
                     help="cap each GPU's memory use at this fraction (passed to torch)")
    _add_sidecar_flags(run, metrics_port=None)
    run.add_argument("--report", metavar="FILE", help="write a JSON report here at the end")
    run.add_argument("--inject", action="store_true",
                     help="load the runtime library into Python commands at start-up: a "
                          "PyTorch program is paced at each optimizer step with no code change")
    run.add_argument("-q", "--quiet", action="store_true",
                     help="no live status line and no summary at the end")
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]",
                     help="the command to run")
    run.set_defaults(func=_run)


def _add_sidecar(sub: argparse._SubParsersAction) -> None:
    side = sub.add_parser("sidecar", help="the agent inside a ThrottledJob pod",
                          description=(
                              "Watch the pod's workload (shared process namespace), hold it to "
                              "the policy's targets and serve /metrics, /healthz, /readyz and "
                              "/status on one port. The policy file is reloaded when it changes."))
    side.add_argument("--policy", metavar="FILE", required=True,
                      help="YAML policy (spec.throttle), usually a projected ConfigMap")
    side.add_argument("--shared-dir", metavar="DIR", required=True,
                      help="directory shared with the workload (settings and progress files)")
    side.add_argument("--root-pid", type=int, metavar="PID",
                      help="watch only this process tree instead of every process in the "
                           "namespace")
    _add_sidecar_flags(side, metrics_port=9400)
    side.set_defaults(func=_sidecar)


def _add_guard(sub: argparse._SubParsersAction) -> None:
    # Internal (the pod's guard container): not listed.
    guard = sub.add_parser("guard", description=(
                               "Beside the sidecar in a ThrottledJob pod: when a stop the "
                               "sidecar announced in DIR has ended and the workload is still "
                               "stopped, send it SIGCONT. Never sends any other signal."))
    guard.add_argument("--shared-dir", metavar="DIR", required=True,
                       help="directory shared with the sidecar (its stop lease)")
    guard.set_defaults(func=_guard)


def _add_operator(sub: argparse._SubParsersAction) -> None:
    op = sub.add_parser("operator", help="run the Kubernetes operator (kopf)",
                        description="Watch ThrottledJobs and run each as a Job with the "
                                    "throttle sidecar. Finds the cluster as kubectl does.")
    scope = op.add_mutually_exclusive_group()
    scope.add_argument("-A", "--all-namespaces", action="store_true",
                       help="watch ThrottledJobs in all namespaces")
    scope.add_argument("-n", "--namespace", action="append", default=[], metavar="NS",
                       help="watch this namespace (repeatable; globs like team-* work)")
    op.add_argument("--standalone", action="store_true",
                    help="no peering (one replica); default: peer if kopf's peering CRDs exist")
    op.add_argument("--peering", metavar="NAME", help="kopf peering object name")
    op.add_argument("--priority", type=int, help="peering priority of this replica")
    op.add_argument("--liveness", metavar="URL",
                    help="serve a liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    op.add_argument("--sidecar-image", metavar="IMAGE",
                    help="image of the injected sidecar (env THROTTLEDJOB_SIDECAR_IMAGE)")
    op.add_argument("--status-interval", type=float, metavar="SECONDS",
                    help="how often to read the sidecars' /status (default 10)")
    op.add_argument("--metrics-port", type=_port, metavar="PORT",
                    help="serve the operator's Prometheus /metrics on this port "
                         "(env THROTTLEDJOB_METRICS_PORT; default: not served)")
    op.add_argument("-v", "--verbose", action="store_true", help="log more")
    op.add_argument("--debug", action="store_true", help="log everything")
    op.set_defaults(func=_operator)


def _add_node(sub: argparse._SubParsersAction) -> None:
    node = sub.add_parser("node", help="the GPU node agent (a DaemonSet on GPU nodes)",
                          description=(
                              "Read this node's GPUs and serve each pod's sidecar its own "
                              "(a CSI volume in the pod), capping a GPU's power where its "
                              "ThrottledJob allows it; every cap is put back."))
    node.add_argument("--node-name", required=True, help="this node (NodeGetInfo)")
    node.add_argument("--kubelet-dir", default="/var/lib/kubelet", metavar="DIR",
                      help="the kubelet's --root-dir (default /var/lib/kubelet)")
    node.add_argument("--state-dir", default="/var/lib/throttledjob/node", metavar="DIR",
                      help="where the caps and volumes are kept across restarts")
    node.add_argument("--gpu-backend", choices=("nvml", "fake"), default="nvml",
                      help="fake: the simulated board (THROTTLEDJOB_FAKE_GPUS)")
    node.add_argument("--metrics-port", type=_port, default=9401,
                      help="serve /metrics on this port (0: none; default 9401)")
    node.add_argument("--metrics-pod-names", action="store_true",
                      help="name the pod holding each GPU and each cap in /metrics "
                           "(default: GPUs alone; whoever scrapes them reads the names)")
    node.set_defaults(func=_node)


def _add_inject_lib(sub: argparse._SubParsersAction) -> None:
    # Internal (the operator's inject init container): not listed.
    lib = sub.add_parser("inject-lib", description=(
                             "Lay out a self-contained copy of the runtime library and a "
                             "sitecustomize.py that loads the torch auto-hook; with DIR on "
                             "PYTHONPATH any Python program is paced with no code change. "
                             "The operator's init container runs this."))
    lib.add_argument("dest", metavar="DIR", help="where to write (created if missing)")
    lib.set_defaults(func=_inject_lib)


def _help(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """A bare `throttledjob`: what it can do."""
    parser.print_help()
    return 0


def _port(text: str) -> int:
    """A TCP port number, 0 (any free one) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (0-65535)")
    return port


def _add_sidecar_flags(p: argparse.ArgumentParser, metrics_port: int | None) -> None:
    # One spelling for every command; the sidecar also takes its first one (--port,
    # --host), which pods made by an older operator still pass.
    old = () if metrics_port is None else (("--port",), ("--host",))
    p.add_argument("--metrics-port", *(old[0] if old else ()), dest="metrics_port",
                   type=_port, default=metrics_port,
                   metavar="PORT", help="serve /metrics, /healthz, /readyz and /status here"
                   + (" (default: off)" if metrics_port is None else f" (default {metrics_port})"))
    p.add_argument("--metrics-host", *(old[1] if old else ()), dest="metrics_host",
                   metavar="ADDRESS", default="127.0.0.1" if metrics_port is None else "0.0.0.0",
                   help="address to bind (default %(default)s)")
    p.add_argument("--gpu-backend", choices=GPU_BACKENDS, default="auto",
                   help="auto: NVML when present, else none; fake: simulated GPUs "
                        "(THROTTLEDJOB_FAKE_GPUS, THROTTLEDJOB_FAKE_GPU_TRACE) (default auto)")
    # A switch, not watts (the watts are --gpu-peak-power): named so that nobody reads
    # it as nvidia-smi's -pl. The first name stays accepted, unlisted.
    p.add_argument("--allow-gpu-power-cap", "--gpu-power-limit", dest="gpu_power_limit",
                   action="store_true",
                   help="allow the privileged lever levers.gpuPowerLimit: cap each GPU's "
                        "board power limit at the power target (restored on exit; needs "
                        "root on the node)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:   # said by the subcommand ('throttledjob run: error: ...'), as other errors
        getattr(args, "subparser", parser).error(
            f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return args.func(args, parser)
    except KeyboardInterrupt:   # before a command started (after, it is forwarded to it)
        return 130


def _fail(prog: str, message: str) -> int:
    sys.stderr.write(f"{prog}: error: {message}\n")
    return EXIT_USAGE


def _missing_extra(prog: str, extra: str, e: ImportError) -> int:
    return _fail(prog, f"needs the {extra} extra ({e.name} is missing): "
                       f"pip install 'throttledjob[{extra}]'")


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    prog = "throttledjob run"
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        return _fail(prog, "missing command: throttledjob run [options] -- CMD [ARGS...]")
    try:
        from throttledjob.contracts.policy import (
            Policy,
            PolicyError,
            load_policy_file,
            parse_cpu_quantity,
        )
        from throttledjob.sidecar.exporter import ExporterError
        from throttledjob.sidecar.local import CommandNotStarted, run_local
        from throttledjob.sidecar.local_report import report_problem
    except ImportError as e:
        return _missing_extra(prog, "sidecar", e)
    try:
        base = load_policy_file(args.policy) if args.policy else Policy()
        policy = base.with_overrides(
            names=RUN_FLAGS,
            cpu_peak_cores=None if args.cpu_peak is None
            else parse_cpu_quantity(args.cpu_peak, "--cpu-peak"),
            max_slowdown=args.max_slowdown, interval_seconds=args.interval,
            hold="hard" if args.hard else None, mode=args.mode, enforcement=args.enforcement,
            gpu_peak_utilization_percent=args.gpu_peak_util,
            gpu_peak_power_watts=args.gpu_peak_power,
            gpu_memory_fraction=args.gpu_memory_fraction,
            gpu_power_limit="allow" if args.gpu_power_limit else None)
    except PolicyError as e:
        return _fail(prog, str(e))
    gpu = _gpu_agent(prog, args, policy)
    if isinstance(gpu, int):
        return gpu
    if args.report is not None and (problem := report_problem(args.report)):
        return _fail(prog, f"--report: {problem}")
    try:
        return run_local(cmd, policy, report_path=args.report,
                         status_stream=None if args.quiet else sys.stderr, gpu=gpu,
                         summary_stream=None if args.quiet else sys.stderr,
                         metrics_address=None if args.metrics_port is None
                         else (args.metrics_host, args.metrics_port),
                         inject=args.inject, die_of_sigint=True)
    except ExporterError as e:
        return _fail(prog, str(e))
    except CommandNotStarted as e:
        sys.stderr.write(f"{prog}: error: {e}\n")
        return e.exit_code


def _operator(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        import kopf  # noqa: F401
    except ImportError as e:
        return _missing_extra("throttledjob operator", "operator", e)
    from throttledjob.operator.main import run_operator

    return run_operator(args)


def _inject_lib(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from throttledjob.runtime.inject import write_library

    try:
        dest = write_library(args.dest)
    except OSError as e:
        return _fail("throttledjob inject-lib", f"cannot write {args.dest}: {e.strerror or e}")
    sys.stdout.write(f"throttledjob: runtime library written to {dest}\n")
    return 0


def _gpu_agent(prog: str, args: argparse.Namespace, policy):
    """The GPU agent for --gpu-backend, or an exit code when the backend cannot open."""
    from throttledjob.gpu import GpuError
    from throttledjob.logs import log_to_stderr
    from throttledjob.runtime.progress_files import visible_devices
    from throttledjob.sidecar.gpu_agent import open_gpu_agent, under_the_floor

    log_to_stderr()
    try:
        agent = open_gpu_agent(args.gpu_backend, policy)
        # The command runs in this environment: the GPUs it may use are the ones to watch
        # (a program that reports no step declares none).
        agent.default_visible = visible_devices()
        floor = policy.gpu_peak_power_watts and under_the_floor(
            policy.gpu_peak_power_watts, agent.backend.read())
    except GpuError as e:
        return _fail(prog, f"--gpu-backend {args.gpu_backend}: {e}")
    if floor:
        agent.close()
        return _fail(prog, f"--gpu-peak-power: {floor}")
    if args.gpu_backend != "auto" or agent.kind != "none" or args.gpu_peak_util \
            or args.gpu_peak_power:
        sys.stderr.write(f"throttledjob: {agent.note}\n")  # said once, at start
    return agent


def _sidecar(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    prog = "throttledjob sidecar"
    try:
        from throttledjob.gpu import GpuError
        from throttledjob.sidecar.exporter import ExporterError
        from throttledjob.sidecar.pod import run_sidecar
    except ImportError as e:
        return _missing_extra(prog, "sidecar", e)
    try:
        return run_sidecar(args.policy, args.shared_dir, host=args.metrics_host,
                           port=args.metrics_port, gpu_backend=args.gpu_backend,
                           gpu_power_limit=args.gpu_power_limit, root_pid=args.root_pid)
    except (ExporterError, GpuError) as e:
        return _fail(prog, str(e))


def _node(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    # First: a SIGTERM during start-up (the tidying pass, the volumes served again) asks
    # for the caps to be put back once it is done, not for the agent to die without.
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    prog = "throttledjob node"
    try:
        from throttledjob.gpu import GpuError, open_backend
        from throttledjob.logs import log_to_stderr
        from throttledjob.node.process import run_node
    except ImportError as e:
        return _missing_extra(prog, "node", e)
    log_to_stderr()
    try:
        backend, note = open_backend(args.gpu_backend)
    except GpuError as e:
        return _fail(prog, f"--gpu-backend {args.gpu_backend}: {e}")
    sys.stderr.write(f"throttledjob node: {note}\n")
    return run_node(backend, Path(args.kubelet_dir), args.node_name, Path(args.state_dir),
                    stopping, args.metrics_port, args.metrics_pod_names)


def guard_main(argv: list[str] | None = None) -> int:
    """`tj-guard --shared-dir DIR`: `throttledjob guard` under the script name the
    operator's guard container runs (its process is named after it from the start)."""
    return main(["guard", *(sys.argv[1:] if argv is None else argv)])


def _guard(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from throttledjob.sidecar.cpu.guard import run_guard

    return run_guard(args.shared_dir)
