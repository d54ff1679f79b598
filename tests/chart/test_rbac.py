"""RBAC of least privilege: the chart grants exactly the API calls the operator makes.

The calls (docs/operator.md, "API calls"), from operator/handlers.py and operator/kube.py:
- kopf watches ThrottledJobs (list, watch) and patches them (its progress annotations);
  kube.update_status gets one and merge-patches its /status;
- kopf watches Jobs for the Job watcher (list, watch); _ensure gets and creates Jobs;
- _ensure / policy_changed get, create and merge-patch the policy ConfigMap;
- the sidecar timer lists Pods (kube.list_pods); kopf.info/warn create Events;
- kopf's own scanning lists and watches CRDs, and, when it watches listed namespaces
  rather than all, lists and watches Namespaces (kopf/_core/reactor/observation.py).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from throttledjob.operator import crd

from .conftest import NAMESPACE, ROOT, by_kind, render

Rules = dict[tuple[str, str], frozenset[str]]

NAMESPACED: Rules = {
    (crd.GROUP, crd.PLURAL): frozenset({"get", "list", "watch", "patch"}),
    (crd.GROUP, f"{crd.PLURAL}/status"): frozenset({"patch"}),
    ("batch", "jobs"): frozenset({"get", "list", "watch", "create"}),
    ("", "configmaps"): frozenset({"get", "create", "patch"}),
    ("", "pods"): frozenset({"list"}),
    ("", "events"): frozenset({"create"}),
}
CRDS: Rules = {("apiextensions.k8s.io", "customresourcedefinitions"):
               frozenset({"list", "watch"})}
NAMESPACES: Rules = {("", "namespaces"): frozenset({"list", "watch"})}


def rules_of(role: dict[str, Any]) -> Rules:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, rule  # no resourceNames etc.
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    for (group, resource), verbs in out.items():
        assert "*" not in (group, resource, *verbs), f"wildcard in {role['metadata']['name']}"
    return {k: frozenset(v) for k, v in out.items()}


def test_cluster_wide_grants_exactly_the_operators_calls(tmp_path) -> None:
    objs = render(None, tmp_path)
    (role,) = by_kind(objs, "ClusterRole")
    assert rules_of(role) == {**NAMESPACED, **CRDS}
    assert by_kind(objs, "Role") == [] and by_kind(objs, "RoleBinding") == []
    (binding,) = by_kind(objs, "ClusterRoleBinding")
    (sa,) = by_kind(objs, "ServiceAccount")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": NAMESPACE}]
    (deploy,) = by_kind(objs, "Deployment")
    assert deploy["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]


def test_listed_namespaces_get_roles_and_nothing_namespaced_cluster_wide(tmp_path) -> None:
    objs = render({"watchNamespaces": ["ml", "team-a"]}, tmp_path)
    roles = by_kind(objs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["ml", "team-a"]
    for role in roles:
        assert rules_of(role) == NAMESPACED
    bindings = by_kind(objs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["ml", "team-a"]
    for b in bindings:
        assert b["roleRef"]["kind"] == "Role"
        assert b["subjects"][0]["namespace"] == NAMESPACE
    # Cluster-wide: only kopf's read-only discovery of CRDs and namespaces.
    (cluster_role,) = by_kind(objs, "ClusterRole")
    assert rules_of(cluster_role) == {**CRDS, **NAMESPACES}


def test_no_rbac_when_switched_off(tmp_path) -> None:
    objs = render({"rbac": {"create": False}, "serviceAccount": {"create": False,
                                                                "name": "mine"}}, tmp_path)
    kinds = {o["kind"] for o in objs}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                        "ServiceAccount"}
    (deploy,) = by_kind(objs, "Deployment")
    assert deploy["spec"]["template"]["spec"]["serviceAccountName"] == "mine"


def test_the_operator_source_uses_no_resource_the_table_misses() -> None:
    """Derive the resources from the operator's code: a new API path or kopf watch that the
    chart does not grant fails here (and a grant the code no longer needs too)."""
    source = "\n".join(p.read_text() for p in sorted((ROOT / "operator").glob("*.py")))
    used: set[tuple[str, str]] = set()
    for m in re.finditer(r"/api/v1/namespaces/\{[^}]+\}/([a-z]+)", source):
        used.add(("", m.group(1)))
    for m in re.finditer(r"/apis/([a-z0-9.]+)/v1\w*/namespaces/\{[^}]+\}/([a-z]+)", source):
        used.add((m.group(1), m.group(2)))
    for m in re.finditer(r"kopf\.on\.event\(\s*\"([a-z0-9.]+)\",\s*\"v1\w*\",\s*\"([a-z]+)\"",
                         source):
        used.add((m.group(1), m.group(2)))
    if re.search(r"kopf\.(on\.\w+|timer|daemon)\(\s*\*RESOURCE", source):
        used.add((crd.GROUP, crd.PLURAL))
    if "tj_path" in source and "/status" in source:
        used |= {(crd.GROUP, crd.PLURAL), (crd.GROUP, f"{crd.PLURAL}/status")}
    if re.search(r"kopf\.(info|warn|event|exception)\(", source):
        used.add(("", "events"))
    assert used == set(NAMESPACED), (
        f"the code uses {sorted(used - set(NAMESPACED))}, the chart grants unused "
        f"{sorted(set(NAMESPACED) - used)}: update templates/_helpers.tpl and this table")


@pytest.mark.parametrize("verb", ["delete", "update", "deletecollection", "escalate", "bind",
                                  "impersonate"])
def test_no_destructive_or_escalating_verb(verb: str, tmp_path) -> None:
    for values in (None, {"watchNamespaces": ["ml"]}):
        for obj in render(values, tmp_path):
            if obj["kind"] in ("ClusterRole", "Role"):
                assert all(verb not in r["verbs"] for r in obj["rules"]), obj["metadata"]
                assert all(r["resources"] != ["secrets"] for r in obj["rules"])

