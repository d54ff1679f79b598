"""The processes' own log: one line per problem on stderr, as a pod's log and the
terminal of `throttledjob run` both want; every module logs under `throttledjob.*`."""

from __future__ import annotations

import logging
import sys


def log_to_stderr() -> None:
    """One line per problem on stderr, as the pod's log and local mode both want."""
    logger = logging.getLogger("throttledjob")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
