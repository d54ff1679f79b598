"""`helm install`, `upgrade` and `uninstall` of the chart against the real API server.

The operator pod is admitted (Pod Security "restricted" on its namespace), scheduled and
reported Running by the KWOK node; nothing executes it (see tools/k8s/cluster.py).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from testing.cluster_cli import Kubectl, helm
from testing.paths import CHART
from tools.k8s import cluster as k8s
from tools.k8s.monitoring_crds import crd_files

# Every kind the chart renders with the default values, besides the CRD.
RELEASED_KINDS = "deployments,serviceaccounts,configmaps,roles,rolebindings"
CLUSTER_KINDS = "clusterroles,clusterrolebindings"


def released(kubectl: Kubectl, release: str, namespace: str) -> list[str]:
    """Objects of the release still in the cluster, as kind/name."""
    selector = f"app.kubernetes.io/instance={release}"
    out = []
    for kinds, scope in ((RELEASED_KINDS, ["-n", namespace]), (CLUSTER_KINDS, [])):
        listed = kubectl.json("get", kinds, *scope, "-l", selector) or {"items": []}
        out += [f"{o['kind']}/{o['metadata']['name']}" for o in listed["items"]]
    return sorted(out)


def test_install_upgrade_uninstall(cluster: Any, kubectl: Kubectl) -> None:
    release = f"tj-{uuid.uuid4().hex[:6]}"
    namespace = f"{release}-system"
    kubectl("create", "namespace", namespace)
    kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    try:
        helm(cluster, "install", release, str(CHART), "-n", namespace, "--wait",
             "--timeout", "120s", "--set", "image.repository=localhost/throttledjob",
             "--set", "image.tag=dev", "--set", "image.pullPolicy=Never",
             # KWOK's node (tainted: a pod that names no node goes to a real one).
             "--set-json", f"nodeSelector={json.dumps(k8s.KWOK_LABELS)}",
             "--set-json", f"tolerations={json.dumps(k8s.ON_KWOK['tolerations'])}")
        deployment = kubectl.json("get", "deployment", "-n", namespace, "-l",
                                  f"app.kubernetes.io/instance={release}")["items"][0]
        assert deployment["status"].get("availableReplicas") == 1
        crd = kubectl.json("get", "crd", "throttledjobs.throttledjob.io")
        assert crd["status"]["acceptedNames"]["shortNames"] == ["tj"]
        before = released(kubectl, release, namespace)
        assert any(o.startswith("ClusterRole/") for o in before), before

        helm(cluster, "upgrade", release, str(CHART), "-n", namespace, "--reuse-values",
             "--wait", "--timeout", "120s", "--set", "operator.statusIntervalSeconds=5")
        args = kubectl.json("get", "deployment", "-n", namespace, "-l",
                            f"app.kubernetes.io/instance={release}")["items"][0][
            "spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--status-interval=5" in args, args
        assert released(kubectl, release, namespace) == before

        events = kubectl.json("get", "events", "-n", namespace) or {"items": []}
        assert [e["message"] for e in events["items"] if e["reason"] == "FailedCreate"] == []

        helm(cluster, "uninstall", release, "-n", namespace, "--wait", "--timeout", "120s")
        assert released(kubectl, release, namespace) == []
        # Helm's rule: the CRD, and so every ThrottledJob, outlives the release.
        assert kubectl.json("get", "crd", "throttledjobs.throttledjob.io") is not None
    finally:
        kubectl("delete", "namespace", namespace, "--wait=false")


MONITORING = ["--set", "monitoring.podMonitor.enabled=true",
              "--set", "monitoring.podMonitor.labels.release=kube-prometheus-stack",
              "--set", "monitoring.prometheusRule.enabled=true",
              "--set", "monitoring.prometheusRule.labels.release=kube-prometheus-stack"]
MONITORING_CRDS = ("podmonitors.monitoring.coreos.com", "prometheusrules.monitoring.coreos.com")


def test_monitoring_installs_where_the_prometheus_operator_is_and_says_so_where_not(
        cluster: Any, kubectl: Kubectl) -> None:
    """README's install with monitoring on: on a cluster without the Prometheus Operator's
    CRDs, one line naming what is missing and the value that turns it off, and nothing of
    the release left; with the project's own CRDs (their Go module), the PodMonitor and
    the PrometheusRule are accepted by their real schemas, with the `release` label a
    kube-prometheus-stack Prometheus selects them by."""
    release = f"tj-{uuid.uuid4().hex[:6]}"
    namespace = f"{release}-system"
    kubectl("create", "namespace", namespace)
    install = ["install", release, str(CHART), "-n", namespace, "--timeout", "120s",
               "--set", "image.repository=localhost/throttledjob", "--set", "image.tag=dev",
               "--set-json", f"nodeSelector={json.dumps(k8s.KWOK_LABELS)}",
               "--set-json", f"tolerations={json.dumps(k8s.ON_KWOK['tolerations'])}",
               *MONITORING]
    try:
        assert not any(kubectl.json("get", "crd", name) for name in MONITORING_CRDS)
        refused = helm(cluster, *install, check=False)
        assert refused.returncode == 1
        # Whichever of the two objects helm renders first: one line.
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert re.search(r"monitoring\.(podMonitor|prometheusRule)\.enabled=true needs the "
                         r"kind monitoring\.coreos\.com/v1/(PodMonitor|PrometheusRule), which "
                         r"this cluster does not serve: install the Prometheus Operator's "
                         r"CRDs .* or set monitoring\.\1\.enabled=false", refused.stderr), \
            refused.stderr
        assert released(kubectl, release, namespace) == []
        assert helm(cluster, "status", release, "-n", namespace, check=False).returncode != 0

        for path in crd_files():
            kubectl("create", "-f", str(path))
        kubectl("wait", "--for=condition=Established", "--timeout=60s",
                *(f"crd/{name}" for name in MONITORING_CRDS))
        helm(cluster, *install)
        for kind in ("podmonitors", "prometheusrules"):
            objs = kubectl.json("get", kind, "-n", namespace, "-l",
                                f"app.kubernetes.io/instance={release}")["items"]
            assert objs and {o["metadata"]["labels"]["release"] for o in objs} == {
                "kube-prometheus-stack"}, kind
        helm(cluster, "uninstall", release, "-n", namespace, "--wait", "--timeout", "120s")
    finally:
        kubectl("delete", "crd", *MONITORING_CRDS, "--ignore-not-found", "--wait=false")
        kubectl("delete", "namespace", namespace, "--wait=false")
