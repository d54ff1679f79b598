"""`helm install`, `upgrade` and `uninstall` of the chart against the real API server.

The operator pod is admitted (Pod Security "restricted" on its namespace), scheduled and
reported Running by the KWOK node; nothing executes it (see tools/k8s/cluster.py).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from testing.cluster_cli import Kubectl, helm
from testing.paths import CHART
from tools.k8s import cluster as k8s

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
