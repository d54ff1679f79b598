"""RBAC of least privilege, as rendered: the chart grants exactly the API calls the operator
makes (proven on a real API server from its audit log: tests/cluster/test_operator_live.py).

The calls (docs/operator.md, "API calls"), from operator/reconcile.py, create.py, poller.py
and kube.py:
- kopf watches ThrottledJobs (list, watch) and patches them (its progress annotations);
  kube.update_status gets one and merge-patches its /status;
- kopf watches Jobs for the Job watcher (list, watch); create.py gets and creates Jobs;
  a reconcile pass patches a Job's spec.suspend (and, with kueue.enabled, it and
  read_queue list and patch Kueue's Workloads);
- create.py / a reconcile pass get, create and merge-patch the policy ConfigMap;
- the sidecar timer lists Pods (kube.list_pods); kopf.info/warn create Events;
- a reconcile pass, under enforcement Quota, lists the Pods and patches their pods/resize;
- no call updates a ThrottledJob's finalizers: admission checks that grant where an owner
  reference blocks the owner's deletion (OwnerReferencesPermissionEnforcement);
- kopf's own scanning lists and watches CRDs, and, when it watches listed namespaces
  rather than all, lists and watches Namespaces (kopf/_core/reactor/observation.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from testing.chart import NAMESPACE, by_kind, render
from testing.rbac import CRDS, JOBSET, KUEUE, NAMESPACED, NAMESPACES, Rules
from throttledjob.operator import api_names
from throttledjob.operator.budget_crd import BUDGET_PLURAL


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


AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"


def operator_rbac(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operator's own RBAC objects: not the roles aggregated into edit and view."""
    return [o for o in objs if not any(k.startswith(AGGREGATE)
                                       for k in o["metadata"].get("labels") or {})]


def test_cluster_wide_grants_exactly_the_operators_calls(tmp_path) -> None:
    objs = operator_rbac(render(None, tmp_path))
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
    objs = operator_rbac(render({"watchNamespaces": ["ml", "team-a"]}, tmp_path))
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


@pytest.mark.parametrize("verb", ["delete", "update", "deletecollection", "escalate", "bind",
                                  "impersonate"])
def test_no_destructive_or_escalating_verb(verb: str, tmp_path) -> None:
    for values in (None, {"watchNamespaces": ["ml"]}):
        for obj in operator_rbac(render(values, tmp_path)):
            if obj["kind"] in ("ClusterRole", "Role"):
                # `update` of a ThrottledJob's finalizers is no call: admission checks it
                # for the owner references the operator writes (testing/rbac.ADMISSION).
                assert all(verb not in r["verbs"] for r in obj["rules"]
                           if r["resources"] != [f"{api_names.PLURAL}/finalizers"]), obj["metadata"]
                assert all(r["resources"] != ["secrets"] for r in obj["rules"])


def test_throttledjobs_are_aggregated_into_edit_and_view(tmp_path) -> None:
    """As for Jobs: editors may manage ThrottledJobs and ThrottleBudgets, viewers only read
    them; nothing else is granted through the aggregation."""
    aggregated = [o for o in by_kind(render(None, tmp_path), "ClusterRole")
                  if o not in operator_rbac([o])]
    by_label = {k.removeprefix(AGGREGATE): rules_of(o) for o in aggregated
                for k in o["metadata"]["labels"] if k.startswith(AGGREGATE)}
    assert set(by_label) == {"edit", "admin", "view"}
    kinds = (api_names.PLURAL, BUDGET_PLURAL)
    assert by_label["edit"] == by_label["admin"] == {(api_names.GROUP, r): frozenset(
        {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"})
        for r in kinds}
    assert by_label["view"] == {(api_names.GROUP, r): frozenset({"get", "list", "watch"})
                                for k in kinds for r in (k, f"{k}/status")}
    assert not [o for o in by_kind(render({"rbac": {"create": False}}, tmp_path), "ClusterRole")]


def test_kueue_adds_exactly_the_workload_calls(tmp_path) -> None:
    """kueue.enabled: the operator holds a queued ThrottledJob's Workload to its suspend
    and reads why it waits (operator/poller.py read_queue): list and patch, no more."""
    (role,) = by_kind(operator_rbac(render({"kueue": {"enabled": True}}, tmp_path)),
                      "ClusterRole")
    assert rules_of(role) == {**NAMESPACED, **KUEUE, **CRDS}


def test_jobset_adds_exactly_the_jobset_calls(tmp_path) -> None:
    """jobset.enabled: the operator makes a ThrottledJob's JobSet, watches it and patches
    its suspend (operator/handlers.py, child.py): no delete, no more."""
    (role,) = by_kind(operator_rbac(render({"jobset": {"enabled": True}}, tmp_path)),
                      "ClusterRole")
    assert rules_of(role) == {**NAMESPACED, **JOBSET, **CRDS}


def test_attach_adds_its_secret_and_its_own_configuration_by_name(tmp_path) -> None:
    """attach.enabled: the webhook's certificate in one Secret (created once, then read and
    renewed by name) and its CA in the chart's own webhook configuration (by name); the
    owner chain it reads is the Jobs' get it has, and a TrainJob's. With cert-manager, the
    Secret read only."""
    objs = operator_rbac(render({"attach": {"enabled": True}}, tmp_path))
    (mwc,) = by_kind(render({"attach": {"enabled": True}}, tmp_path),
                     "MutatingWebhookConfiguration")
    roles = {o["metadata"]["name"]: o for o in by_kind(objs, "ClusterRole")}
    (webhook,) = [r for name, r in roles.items() if name.endswith("-webhook")]
    (operator,) = [r for name, r in roles.items() if not name.endswith("-webhook")]
    assert rules_of(operator) == {**NAMESPACED, **CRDS,
                                  ("trainer.kubeflow.org", "trainjobs"): {"get"}}
    assert webhook["rules"] == [{"apiGroups": ["admissionregistration.k8s.io"],
                                 "resources": ["mutatingwebhookconfigurations"],
                                 "resourceNames": [mwc["metadata"]["name"]],
                                 "verbs": ["get", "update"]}]
    (role,) = by_kind(objs, "Role")
    (deploy,) = by_kind(objs, "Deployment")
    env = {e["name"]: e.get("value") for e in
           deploy["spec"]["template"]["spec"]["containers"][0]["env"]}
    secret = env["THROTTLEDJOB_WEBHOOK_SECRET"]
    assert secret.startswith(f"{NAMESPACE}/") and role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [secret.split("/")[1]],
         "verbs": ["get", "update"]}]
    managed = operator_rbac(render({"attach": {"enabled": True,
                                               "certManager": {"enabled": True}}},
                                   tmp_path, "--api-versions", "cert-manager.io/v1/Certificate"))
    assert not [r for r in by_kind(managed, "ClusterRole")
                if r["metadata"]["name"].endswith("-webhook")]
    (role,) = by_kind(managed, "Role")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"],
                              "resourceNames": [secret.split("/")[1]], "verbs": ["get"]}]
