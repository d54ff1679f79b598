"""`throttledjob operator` (options in cli/cli.py, named as kopf run's): kopf.run with
our handlers."""

from __future__ import annotations

import argparse
import os
import sys


def run_operator(args: argparse.Namespace) -> int:
    if not args.all_namespaces and not args.namespace:
        sys.stderr.write("throttledjob operator: error: pass -A/--all-namespaces or "
                         "-n/--namespace NS\n")
        return 2
    if args.status_interval is not None and args.status_interval <= 0:
        sys.stderr.write("throttledjob operator: error: --status-interval must be > 0\n")
        return 2
    # Flags override the environment; the handlers read their settings from it at import
    # (kopf's timer interval is fixed when the decorator runs).
    if args.sidecar_image:
        os.environ["THROTTLEDJOB_SIDECAR_IMAGE"] = args.sidecar_image
    if args.status_interval is not None:
        os.environ["THROTTLEDJOB_STATUS_INTERVAL"] = str(args.status_interval)
    import kopf

    from throttledjob.operator import handlers  # noqa: F401  (registers the handlers)

    kopf.configure(debug=args.debug, verbose=args.verbose)
    kopf.run(standalone=True if args.standalone else None,
             clusterwide=args.all_namespaces, namespaces=args.namespace,
             liveness_endpoint=args.liveness, peering_name=args.peering,
             priority=args.priority)
    return 0
