"""The scrape jobs the Prometheus Operator makes of the chart's PodMonitors, for a real
Prometheus against the real API server (Kubernetes discovery of pods, as a
ServiceAccount that may only list and watch pods)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testing.cluster_cli import Kubectl
from throttledjob.operator.api_names import SIDECAR_CONTAINER

META = "__meta_kubernetes_pod_"


def identity(cluster: Any, kubectl: Kubectl, namespaces: list[str], workdir: Path) -> Path:
    """A ServiceAccount "prometheus" (in the first namespace) that may read the pods of
    `namespaces`; returns its token's file."""
    home = namespaces[0]
    kubectl.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": "prometheus", "namespace": home}})
    for namespace in namespaces:
        kubectl.apply(
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "prometheus", "namespace": namespace},
             "rules": [{"apiGroups": [""], "resources": ["pods"],
                        "verbs": ["get", "list", "watch"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "prometheus", "namespace": namespace},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                         "name": "prometheus"},
             "subjects": [{"kind": "ServiceAccount", "name": "prometheus",
                           "namespace": home}]})
    token = workdir / "prometheus.token"
    token.write_text(cluster.service_account_token(home, "prometheus"))
    return token


def _pods(cluster: Any, namespace: str, token: Path) -> list[dict[str, Any]]:
    return [{"role": "pod", "api_server": cluster.server,
             "namespaces": {"names": [namespace]},
             "authorization": {"credentials_file": str(token)},
             "tls_config": {"ca_file": str(cluster.dir / "certs" / "apiserver.crt")}}]


def _keep(meta: str, regex: str) -> dict[str, Any]:
    return {"source_labels": [f"{META}{meta}"], "regex": regex, "action": "keep"}


def _target_labels() -> list[dict[str, Any]]:
    return [{"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": [f"{META}name"], "target_label": "pod"}]


def sidecars(cluster: Any, namespace: str, token: Path) -> dict[str, Any]:
    """The chart's `<release>-sidecars` PodMonitor: each pod sidecar's `metrics` port, with
    namespace, pod, throttledjob and node labels."""
    return {
        "job_name": "throttledjob-sidecars",
        "kubernetes_sd_configs": _pods(cluster, namespace, token),
        "relabel_configs": [
            _keep("label_app_kubernetes_io_managed_by", "throttledjob-operator"),
            _keep("container_port_name", "metrics"),
            _keep("container_name", SIDECAR_CONTAINER),
            *_target_labels(),
            {"source_labels": [f"{META}label_throttledjob_io_name"],
             "target_label": "throttledjob"},
            {"source_labels": [f"{META}node_name"], "target_label": "node"}],
    }


def operator(cluster: Any, namespace: str, token: Path,
             endpoint: dict[str, Any]) -> dict[str, Any]:
    """The chart's `<release>-operator` PodMonitor, whose `podMetricsEndpoints` entry is
    `endpoint` (as the chart renders it): the operator pod's `metrics` port."""
    return {
        "job_name": "throttledjob-operator",
        "honor_labels": bool(endpoint.get("honorLabels")),
        "kubernetes_sd_configs": _pods(cluster, namespace, token),
        "relabel_configs": [_keep("label_app_kubernetes_io_name", "throttledjob"),
                            _keep("container_port_name", endpoint["port"]),
                            *_target_labels()],
    }
