"""`throttledjob operator` (options in throttledjob/cli.py, named as kopf run's): kopf.run
with our handlers."""

from __future__ import annotations

import argparse
import os
import socket
import sys


def run_operator(args: argparse.Namespace) -> int:
    if not args.all_namespaces and not args.namespace:
        sys.stderr.write("throttledjob operator: error: pass -A/--all-namespaces or "
                         "-n/--namespace NS\n")
        return 2
    if args.status_interval is not None and args.status_interval <= 0:
        sys.stderr.write("throttledjob operator: error: --status-interval must be > 0\n")
        return 2
    import kopf

    from throttledjob.operator import handlers  # noqa: F401  (registers the handlers)

    # The flags override the environment: kopf hands this memo to the startup handler
    # (handlers.configure), which reads the environment once and applies these on top.
    flags = {"sidecar_image": args.sidecar_image or None,
             "status_interval_seconds": args.status_interval,
             "metrics_port": args.metrics_port}
    kopf.configure(debug=args.debug, verbose=args.verbose)
    # kopf's default identity is the login name, which a UID without a passwd entry (the
    # image's 65532, or any runAsUser) does not have: it would not start.
    identity = f"throttledjob@{socket.gethostname()}/{os.getpid()}"
    kopf.run(standalone=True if args.standalone else None, identity=identity,
             clusterwide=args.all_namespaces, namespaces=args.namespace,
             liveness_endpoint=args.liveness, peering_name=args.peering,
             priority=args.priority,
             memo=kopf.Memo(overrides={k: v for k, v in flags.items() if v is not None},
                            namespaces=[] if args.all_namespaces else list(args.namespace)))
    return 0
