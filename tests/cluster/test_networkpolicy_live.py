"""The chart's NetworkPolicies (networkPolicy.enabled) on the real API server.

The server validates what `helm template` renders (endPort after port and at most 65535,
protocols, selectors, CIDRs) and keeps every field (a server that dropped endPort would
leave one port open instead of a range). Its label selection shows the policy selects the
pods the Job controller creates from a Job the operator builds, and not the operator's pod.

No network plugin enforces NetworkPolicy here (KWOK runs no containers, nothing routes pod
traffic): what is tested is what the API stores and selects, not packets.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from testing.cluster_cli import OPERATOR_NAMESPACE, Kubectl, helm_template, wait_json
from testing.manifests import operator_job
from tools.k8s.cluster import ON_KWOK


def selector_arg(selector: dict[str, Any]) -> str:
    """A LabelSelector as kubectl's -l syntax."""
    parts = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for e in selector.get("matchExpressions") or []:
        assert e["operator"] == "Exists", e
        parts.append(e["key"])
    return ",".join(parts)


def test_the_server_accepts_the_policies_and_they_select_the_built_pods(
        kubectl: Kubectl, namespace: str, tmp_path: Path) -> None:
    other = f"t-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", other)
    kubectl("create", "namespace", OPERATOR_NAMESPACE, check=False)
    suffix = uuid.uuid4().hex[:6]
    releases = {f"np-{suffix}": {"namespaces": [namespace]},
                # A non-default port (ranges around it) and node CIDRs of both families.
                f"np2-{suffix}": {"namespaces": [other], "metricsPort": 9500,
                                  "nodeCIDRs": ["10.0.0.0/16", "fd00::/64"]}}
    try:
        policies = []
        for release, values in releases.items():
            objs = helm_template(release, {"networkPolicy": {"enabled": True, **values}},
                                 tmp_path)
            policies += [o for o in objs if o["kind"] == "NetworkPolicy"]
        assert len(policies) == 4  # per release: its namespace's, the operator pod's
        kubectl.apply(*policies)
        for p in policies:
            stored = kubectl.json("get", "networkpolicy", "-n", p["metadata"]["namespace"],
                                  p["metadata"]["name"])
            # Kept as rendered, endPort included (the server defaults nothing we left out).
            assert stored["spec"] == p["spec"], p["metadata"]
        # The server does validate: a range ending before it starts is refused.
        broken = {**policies[0], "metadata": {"name": "broken", "namespace": namespace}}
        broken["spec"] = {**broken["spec"], "ingress": [
            {"ports": [{"protocol": "TCP", "port": 9401, "endPort": 9399}]}]}
        proc = kubectl.apply(broken, check=False)
        assert proc.returncode != 0 and "endPort" in proc.stderr, proc.stderr

        # A Job as the operator builds it: its pods are what the policy selects, and
        # their sidecar's metrics port is the one the policy guards.
        (policy,) = [p for p in policies if p["metadata"]["namespace"] == namespace]
        job = operator_job(name="np-train", **ON_KWOK)
        job["metadata"]["namespace"] = namespace
        kubectl.apply(job)
        pods = wait_json(kubectl, lambda o: o["items"], "pods", "-n", namespace, "-l",
                         selector_arg(policy["spec"]["podSelector"]),
                         what="the Job's pod")["items"]
        assert {p["metadata"]["labels"]["job-name"] for p in pods} == {"np-train"}
        ports = {p["containerPort"] for c in pods[0]["spec"]["initContainers"]
                 for p in c.get("ports") or [] if p["name"] == "metrics"}
        guarded = {p["port"] for rule in policy["spec"]["ingress"] if rule.get("from")
                   for p in rule["ports"]}
        assert ports == guarded == {9400}
    finally:
        kubectl("delete", "namespace", other, "--wait=false")
        for release in releases:
            kubectl("delete", "networkpolicy", "-n", OPERATOR_NAMESPACE, "-l",
                    f"app.kubernetes.io/instance={release}", check=False)
