"""The API calls the operator makes, as RBAC rules (tests/chart/test_rbac.py has where
each comes from); the chart must grant exactly these."""

from __future__ import annotations

from throttledjob.operator import api_names

Rules = dict[tuple[str, str], frozenset[str]]

NAMESPACED: Rules = {
    (api_names.GROUP, api_names.PLURAL): frozenset({"get", "list", "watch", "patch"}),
    (api_names.GROUP, f"{api_names.PLURAL}/status"): frozenset({"patch"}),
    (api_names.GROUP, "throttlebudgets"): frozenset({"get", "list", "watch"}),
    (api_names.GROUP, "throttlebudgets/status"): frozenset({"patch"}),
    # Checked by admission (OwnerReferencesPermissionEnforcement), never called: see
    # ADMISSION.
    (api_names.GROUP, f"{api_names.PLURAL}/finalizers"): frozenset({"update"}),
    ("batch", "jobs"): frozenset({"get", "list", "watch", "create", "patch"}),
    ("", "configmaps"): frozenset({"get", "create", "patch"}),
    ("", "pods"): frozenset({"list"}),
    ("", "pods/resize"): frozenset({"patch"}),
    ("", "events"): frozenset({"create"}),
}
# With the chart's kueue.enabled: Kueue's Workloads of queued ThrottledJobs.
KUEUE: Rules = {("kueue.x-k8s.io", "workloads"): frozenset({"list", "patch"})}
# With the chart's jobset.enabled: ThrottledJobs whose child is a JobSet.
JOBSET: Rules = {("jobset.x-k8s.io", "jobsets"):
                 frozenset({"get", "list", "watch", "create", "patch"})}
CRDS: Rules = {("apiextensions.k8s.io", "customresourcedefinitions"):
               frozenset({"list", "watch"})}
NAMESPACES: Rules = {("", "namespaces"): frozenset({"list", "watch"})}
# Grants no call uses, which an admission plugin checks: the blockOwnerDeletion of the
# owner references the operator writes (the test cluster's API server enables the plugin).
ADMISSION: Rules = {(api_names.GROUP, f"{api_names.PLURAL}/finalizers"): frozenset({"update"})}
