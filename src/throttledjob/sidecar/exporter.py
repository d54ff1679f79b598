"""Glue between an Agent and the HTTP endpoints, shared by local mode and the pod sidecar.

After every cycle it records the sidecar's health (problems in force, cycle count) and
publishes a snapshot; the HTTP server serves the latest one.
"""

from __future__ import annotations

import logging
import sys

from .agent import Agent
from .server import MetricsServer
from .snapshot import Health, SnapshotHolder, progress_problem

log = logging.getLogger("throttledjob.sidecar")


class ExporterError(RuntimeError):
    """The metrics port cannot be bound (in use, privileged, bad address)."""


class Exporter:
    """Binds the port at once (before any workload starts); `attach` an agent, `start`."""

    def __init__(self, host: str, port: int, interval_seconds: float = 1.0) -> None:
        self.holder = SnapshotHolder()
        self.health = Health()
        try:
            self.server = MetricsServer(self.holder, host, port, interval_seconds)
        except OSError as e:
            raise ExporterError(f"cannot serve metrics on {host}:{port}: "
                                f"{e.strerror or e}") from None

    def attach(self, agent: Agent, cpu_telemetry: str) -> Exporter:
        self.health.cpu_telemetry = cpu_telemetry
        self.server.interval_seconds = agent.policy.interval_seconds
        agent.observers.append(self.after_cycle)
        return self

    def start(self) -> Exporter:
        self.server.start()
        self.server.ready = True
        return self

    @property
    def port(self) -> int:
        return self.server.port

    def after_cycle(self, agent: Agent) -> None:
        h = self.health
        h.cycles += 1
        h.last_cycle_duration = agent.last_cycle_seconds
        self.report("settings", agent.status.error)
        # The GPU agent logs its own line (it also runs without an exporter).
        self.report("gpu", agent.gpu.error if agent.gpu else None, log_it=False)
        self.report("progress", progress_problem(agent.settings_dir))
        self.holder.publish(agent, h)

    def report(self, kind: str, message: str | None, log_it: bool = True) -> None:
        """Record a problem; log one line when it appears or changes, not every cycle."""
        if log_it and message and self.health.problems.get(kind) != message:
            log.warning("throttledjob: %s: %s", kind, message)
        self.health.problem(kind, message)

    def close(self) -> None:
        self.server.close()


def log_to_stderr() -> None:
    """One line per problem on stderr, as the pod's log and local mode both want."""
    logger = logging.getLogger("throttledjob")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)

