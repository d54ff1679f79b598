"""Glue between an Agent and the HTTP endpoints, shared by local mode and the pod sidecar.

After every cycle it records the sidecar's health (problems in force, cycle count) and
publishes a snapshot of the cycle's result; the HTTP server serves the latest one. The
loop tells it what only the loop knows (policy reloads, CPU telemetry) through methods,
never by writing into its server or health.
"""

from __future__ import annotations

import logging

from .agent import Agent
from .record import CycleResult
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
        self._shared_dir: str | None = None
        try:
            self.server = MetricsServer(self.holder, host, port, interval_seconds)
        except OSError as e:
            raise ExporterError(f"cannot serve metrics on {host}:{port}: "
                                f"{e.strerror or e}") from None

    def attach(self, agent: Agent, cpu_telemetry: str) -> Exporter:
        self.health.cpu_telemetry = cpu_telemetry
        self.set_interval(agent.policy.interval_seconds)
        self._shared_dir = agent.settings_dir
        agent.observers.append(self.after_cycle)
        return self

    def set_interval(self, seconds: float) -> None:
        """The control interval, by which /healthz judges the loop stalled."""
        self.server.interval_seconds = seconds

    def set_cpu_telemetry(self, description: str) -> None:
        self.health.cpu_telemetry = description

    def set_policy_reloads(self, reloads: dict[str, int]) -> None:
        """Policy reloads so far, by outcome ("success", "failure")."""
        self.health.policy_reloads = dict(reloads)

    def start(self) -> Exporter:
        self.server.start()
        self.server.ready = True
        return self

    @property
    def port(self) -> int:
        return self.server.port

    def after_cycle(self, result: CycleResult) -> None:
        h = self.health
        h.cycles += 1
        h.last_cycle_duration = result.cycle_seconds
        self.report("settings", result.last.error)
        # The GPU agent logs its own line (it also runs without an exporter).
        self.report("gpu", result.gpu.error if result.gpu else None, log_it=False)
        if self._shared_dir is not None:
            self.report("progress", progress_problem(self._shared_dir))
        self.holder.publish(result, h)

    def report(self, kind: str, message: str | None, log_it: bool = True) -> None:
        """Record a problem; log one line when it appears or changes, not every cycle."""
        if log_it and message and self.health.problems.get(kind) != message:
            log.warning("throttledjob: %s: %s", kind, message)
        self.health.problem(kind, message)

    def close(self) -> None:
        self.server.close()
