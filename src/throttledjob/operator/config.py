"""The operator's own settings: what it injects and how often it looks, read once from the
environment (and the command line's flags) when kopf starts; handlers get them in memo."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class OperatorSettings:
    """What the operator injects; every field has an environment variable (from_env)."""

    sidecar_image: str = "ghcr.io/throttledjob/throttledjob:0.1.0"
    sidecar_cpu_request: str = "50m"
    sidecar_memory_request: str = "64Mi"
    sidecar_memory_limit: str = "128Mi"
    shared_dir_size_limit: str = "16Mi"
    inject_dir_size_limit: str = "32Mi"
    status_interval_seconds: float = 10.0
    status_timeout_seconds: float = 2.0
    # Each API call of the operator's own (kopf has its own settings for its calls).
    api_timeout_seconds: float = 10.0
    # Level-triggered safety net: re-read each unfinished ThrottledJob's Job this often,
    # so a Job event lost to an API failure or a restart still reaches the status.
    resync_seconds: float = 60.0
    # Threads running the (blocking) handlers; kopf's default is 6 on 2 cores.
    handler_threads: int = 32
    # hostPID, hostIPC, hostNetwork and privileged containers in a ThrottledJob's pod.
    allow_host_access: bool = False
    # Run ThrottledJobs of a JobSet (spec.jobSetTemplate): watch JobSets, which needs the
    # chart's jobset.enabled grants (without them kopf's watch would be refused).
    jobsets: bool = False
    # The GPU node agent runs on the GPU nodes (the chart's gpu.nodeAgent.enabled): the
    # sidecar of a pod that requests GPUs gets the agent's CSI volume.
    node_agent: bool = False
    # The operator's own /metrics (operator/metrics.py) on this port; 0: not served.
    metrics_port: int = 0
    # The prometheus.io/scrape|port|path annotations on every pod, for a Prometheus that
    # discovers pods by them. Off where the chart's PodMonitor scrapes the sidecars: a
    # Prometheus doing both would scrape each twice and double every sum.
    scrape_annotations: bool = True
    extra_pod_labels: Mapping[str, str] = field(default_factory=dict)
    # Attach mode's admission webhook (admission.py): HTTPS on this port; 0: not served.
    webhook_port: int = 0
    # "namespace/name" of the Secret with its certificate (ca.crt, tls.crt, tls.key).
    webhook_secret: str = ""
    # Made and rotated by the operator, its CA written into this MutatingWebhookConfiguration
    # (webhook_certs.py); empty: the Secret is someone else's (cert-manager) and only read.
    webhook_config: str = ""
    # The names the certificate is for: the webhook Service's DNS names (or an IP).
    webhook_hosts: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorSettings:
        env = os.environ if env is None else env
        names = {"sidecar_image": "THROTTLEDJOB_SIDECAR_IMAGE",
                 "sidecar_cpu_request": "THROTTLEDJOB_SIDECAR_CPU_REQUEST",
                 "sidecar_memory_request": "THROTTLEDJOB_SIDECAR_MEMORY_REQUEST",
                 "sidecar_memory_limit": "THROTTLEDJOB_SIDECAR_MEMORY_LIMIT",
                 "shared_dir_size_limit": "THROTTLEDJOB_SHARED_DIR_SIZE_LIMIT",
                 "inject_dir_size_limit": "THROTTLEDJOB_INJECT_DIR_SIZE_LIMIT"}
        values: dict[str, Any] = {attr: env[var] for attr, var in names.items() if env.get(var)}
        for attr, var in (("status_interval_seconds", "THROTTLEDJOB_STATUS_INTERVAL"),
                          ("status_timeout_seconds", "THROTTLEDJOB_STATUS_TIMEOUT"),
                          ("api_timeout_seconds", "THROTTLEDJOB_API_TIMEOUT"),
                          ("resync_seconds", "THROTTLEDJOB_RESYNC_INTERVAL")):
            if env.get(var):
                values[attr] = float(env[var])
        for attr, var in (("allow_host_access", "THROTTLEDJOB_ALLOW_HOST_ACCESS"),
                          ("jobsets", "THROTTLEDJOB_JOBSETS"),
                          ("node_agent", "THROTTLEDJOB_NODE_AGENT"),
                          ("scrape_annotations", "THROTTLEDJOB_SCRAPE_ANNOTATIONS")):
            if env.get(var):
                values[attr] = env[var] == "true"
        if env.get("THROTTLEDJOB_HANDLER_THREADS"):
            values["handler_threads"] = int(env["THROTTLEDJOB_HANDLER_THREADS"])
        if env.get("THROTTLEDJOB_WEBHOOK_PORT"):
            values["webhook_port"] = int(env["THROTTLEDJOB_WEBHOOK_PORT"])
        for attr, var in (("webhook_secret", "THROTTLEDJOB_WEBHOOK_SECRET"),
                          ("webhook_config", "THROTTLEDJOB_WEBHOOK_CONFIG")):
            if env.get(var):
                values[attr] = env[var]
        if env.get("THROTTLEDJOB_WEBHOOK_HOSTS"):
            values["webhook_hosts"] = tuple(h.strip() for h in
                                            env["THROTTLEDJOB_WEBHOOK_HOSTS"].split(",")
                                            if h.strip())
        if env.get("THROTTLEDJOB_METRICS_PORT"):
            values["metrics_port"] = int(env["THROTTLEDJOB_METRICS_PORT"])
        return cls(**values)
