"""The chart's ValidatingAdmissionPolicy on a real API server: a ThrottledJob is refused
unless its author could create the Job itself, and host access is refused unless the
chart allows it (a ThrottledJob must not be a way around RBAC or Pod Security)."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testing.cluster_cli import Kubectl, helm_template, wait_json
from testing.helpers import wait_for
from testing.manifests import tj_manifest
from throttledjob.contracts.names import NODE_CSI_DRIVER, NODE_POWER_CAP_ATTRIBUTE

ADMISSION_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                   "ClusterRole")


def install_admission(kubectl: Kubectl, tmp: Path, release: str | None = None,
                      **values: Any) -> list[dict[str, Any]]:
    release = release or f"adm-{uuid.uuid4().hex[:6]}"
    objs = [o for o in helm_template(release, {"admission": values} if values else {}, tmp)
            if o["kind"] in ADMISSION_KINDS and ("aggregate-to-edit" in str(o["metadata"])
                                                 or "aggregate-to-view" in str(o["metadata"])
                                                 or o["kind"] != "ClusterRole")]
    kubectl.apply(*objs)
    return objs


def remove(kubectl: Kubectl, objs: list[dict[str, Any]]) -> None:
    for o in objs:
        kubectl("delete", o["kind"].lower(), o["metadata"]["name"], "--ignore-not-found")


@pytest.fixture
def admission(kubectl: Kubectl, crd_installed: None, tmp_path: Path) -> Iterator[None]:
    objs = install_admission(kubectl, tmp_path)
    yield
    remove(kubectl, objs)


def user(cluster: Any, kubectl: Kubectl, namespace: str, tmp: Path,
         rules: list[dict[str, Any]] | None = None, cluster_role: str | None = None) -> Kubectl:
    """A ServiceAccount of `namespace` with a Role of `rules` (or a RoleBinding to
    `cluster_role`), as kubectl with its own token."""
    name = f"u-{uuid.uuid4().hex[:6]}"
    kubectl("create", "serviceaccount", "-n", namespace, name)
    if rules is not None:
        kubectl.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                       "metadata": {"name": name, "namespace": namespace}, "rules": rules})
        ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
    else:
        ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
               "name": cluster_role}
    kubectl.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                   "metadata": {"name": name, "namespace": namespace}, "roleRef": ref,
                   "subjects": [{"kind": "ServiceAccount", "name": name,
                                 "namespace": namespace}]})
    token = cluster.service_account_token(namespace, name)
    return Kubectl(cluster.kubeconfig_for(token, tmp / f"{name}.kubeconfig", name))


def create(as_: Kubectl, tj: dict[str, Any]) -> tuple[bool, str]:
    import yaml

    proc = as_("create", "-f", "-", stdin=yaml.safe_dump(tj), check=False)
    return proc.returncode == 0, proc.stderr


def eventually_created(as_: Kubectl, tj: dict[str, Any]) -> str:
    """RBAC and admission policies reach the API server's caches within a moment."""
    outcome: dict[str, Any] = {}

    def attempt() -> bool:
        outcome["ok"], outcome["err"] = create(as_, tj)
        return outcome["ok"]

    wait_for(attempt, 30, interval=0.5, what=f"the create to be allowed: {outcome}")
    return tj["metadata"]["name"]


def eventually_refused(as_: Kubectl, tj: dict[str, Any], message: str) -> str:
    outcome: dict[str, Any] = {}

    def attempt() -> bool:
        outcome["ok"], outcome["err"] = create(as_, tj)
        if outcome["ok"]:  # the policy was not in force yet: undo and retry
            as_("delete", tj["kind"].lower(), "-n", tj["metadata"]["namespace"],
                tj["metadata"]["name"], check=False)
        return not outcome["ok"]

    wait_for(attempt, 30, interval=0.5, what="the create to be refused")
    assert message in outcome["err"], outcome["err"]
    return outcome["err"]


def test_a_user_who_may_not_create_jobs_may_not_create_a_throttledjob(
        cluster: Any, kubectl: Kubectl, admission: None, namespace: str, tmp_path: Path) -> None:
    tj_only = user(cluster, kubectl, namespace, tmp_path, rules=[
        {"apiGroups": ["throttledjob.io"], "resources": ["throttledjobs"],
         "verbs": ["create", "get"]}])
    eventually_refused(tj_only, tj_manifest("deputy", namespace),
                       "may not create Jobs in namespace " + namespace)
    # The built-in edit role (which may create Jobs) gets ThrottledJobs by aggregation.
    editor = user(cluster, kubectl, namespace, tmp_path, cluster_role="edit")
    eventually_created(editor, tj_manifest("allowed", namespace))


@pytest.mark.parametrize("field", ["hostPID", "hostIPC", "hostNetwork", "privileged"])
def test_host_access_is_refused_even_for_an_admin(kubectl: Kubectl, admission: None,
                                                  namespace: str, field: str) -> None:
    tj = tj_manifest(f"host-{field.lower()}", namespace)
    pod = tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    if field == "privileged":
        pod["containers"][0]["securityContext"]["privileged"] = True
    else:
        pod[field] = True
    eventually_refused(kubectl, tj, "are refused in a ThrottledJob")


# The CPU peak as a Pod's cpu takes it: a number or a quantity string, within the
# parser's bounds; anything else refused in one line (the CRD keeps any value there).
CPU_PEAKS = [(1.5, True), (2, True), (0.01, True), ("1.5", True), ("1500m", True),
             ("4096", True), ("1.5 cores", False), ("-1", False), (0, False), (-1.5, False),
             ("9" * 40, False), ("5m", False), ("4097", False), (4096.5, False),
             (True, False), ({"cores": 1}, False), ([1], False)]


def test_a_cpu_peak_is_a_number_or_a_quantity_string_as_in_a_pod(
        kubectl: Kubectl, admission: None, namespace: str) -> None:
    def with_peak(peak: Any) -> dict[str, Any]:
        tj = tj_manifest("peak", namespace)
        tj["spec"]["throttle"]["targets"] = {"cpu": {"peak": peak}}
        return tj

    message = ("targets.cpu.peak must be a CPU quantity like 1500m or 1.5 (a string or a "
               "number, as in a Pod), between 10m and 4096")
    eventually_refused(kubectl, with_peak("5m"), message)  # the policy is in force
    import yaml

    for peak, accepted in CPU_PEAKS:
        proc = kubectl("create", "--dry-run=server", "-f", "-",
                       stdin=yaml.safe_dump(with_peak(peak)), check=False)
        assert (proc.returncode == 0) == accepted, (peak, proc.stderr)
        assert accepted or message in proc.stderr, (peak, proc.stderr)


def test_host_access_when_the_chart_allows_it(kubectl: Kubectl, crd_installed: None,
                                              namespace: str, tmp_path: Path) -> None:
    objs = install_admission(kubectl, tmp_path, allowHostAccess=True)
    try:
        tj = tj_manifest("host-allowed", namespace)
        tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["hostPID"] = True
        eventually_created(kubectl, tj)
    finally:
        remove(kubectl, objs)


def of_a_jobset(tj: dict[str, Any]) -> dict[str, Any]:
    """`tj` with its Job as the second of two replicatedJobs of a JobSet instead."""
    job = tj["spec"].pop("jobTemplate")
    driver = copy.deepcopy(job)
    tj["spec"]["jobSetTemplate"] = {"spec": {"replicatedJobs": [
        {"name": "driver", "replicas": 1, "template": driver},
        {"name": "worker", "replicas": 2, "template": job}]}}
    return tj


def test_a_jobsets_author_needs_the_right_to_create_jobsets_and_no_host_access(
        cluster: Any, kubectl: Kubectl, admission: None, namespace: str,
        tmp_path: Path) -> None:
    """A ThrottledJob of a JobSet: its author must be allowed to create JobSets (being
    allowed Jobs is not enough), and every replicatedJob's pods are checked for host
    access, not only the first."""
    tj_rule = {"apiGroups": ["throttledjob.io"], "resources": ["throttledjobs"],
               "verbs": ["create", "get"]}
    jobs = {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}
    jobsets = {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"],
               "verbs": ["create"]}
    jobs_only = user(cluster, kubectl, namespace, tmp_path, rules=[tj_rule, jobs])
    eventually_refused(jobs_only, of_a_jobset(tj_manifest("set-deputy", namespace)),
                       "may not create JobSets in namespace " + namespace)
    allowed = user(cluster, kubectl, namespace, tmp_path, rules=[tj_rule, jobsets])
    eventually_created(allowed, of_a_jobset(tj_manifest("set-allowed", namespace)))
    hosty = of_a_jobset(tj_manifest("set-host", namespace))
    hosty["spec"]["jobSetTemplate"]["spec"]["replicatedJobs"][1]["template"]["spec"][
        "template"]["spec"]["hostNetwork"] = True
    eventually_refused(kubectl, hosty, "are refused in a ThrottledJob")


def attached_to(name: str, namespace: str, ref: dict[str, Any]) -> dict[str, Any]:
    tj = tj_manifest(name, namespace)
    del tj["spec"]["jobTemplate"]
    tj["spec"]["workloadRef"] = ref
    return tj


def test_only_a_workloads_author_may_attach_a_throttle_to_it_in_its_own_namespace(
        cluster: Any, kubectl: Kubectl, admission: None, namespace: str,
        tmp_path: Path) -> None:
    """The threat model of attach mode: a ThrottledJob's workloadRef changes the pods of
    a workload someone made, so its author must be allowed to update that workload
    themselves (reading it is not enough; creating Jobs is not needed), and it must be
    in the ThrottledJob's own namespace, even for an admin."""
    tj_rule = {"apiGroups": ["throttledjob.io"], "resources": ["throttledjobs"],
               "verbs": ["create", "get"]}
    ref = {"apiVersion": "batch/v1", "kind": "Job", "name": "theirs"}
    reader = user(cluster, kubectl, namespace, tmp_path, rules=[tj_rule, {
        "apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "create"]}])
    eventually_refused(reader, attached_to("deputy", namespace, ref),
                       f"may not update Job theirs in namespace {namespace}")
    author = user(cluster, kubectl, namespace, tmp_path, rules=[tj_rule, {
        "apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["update"],
        "resourceNames": ["theirs"]}])
    eventually_created(author, attached_to("authors", namespace, ref))
    # By label: the workloads' makers opt in with the label; creating it needs no more.
    labeled = attached_to("standing", namespace, ref)
    del labeled["spec"]["workloadRef"]
    labeled["spec"]["labeledWorkloads"] = {}
    eventually_created(author, labeled)
    eventually_refused(kubectl, attached_to("elsewhere", namespace,
                                            {**ref, "namespace": "default"}),
                       f"only to a workload in its own namespace ({namespace}), not default")


def test_the_operators_own_writes_are_not_judged_by_its_rights(
        cluster: Any, kubectl: Kubectl, crd_installed: None, namespace: str,
        tmp_path: Path) -> None:
    """kopf marks a ThrottledJob handled with an annotation, an UPDATE the policy would
    judge by the operator's rights: without JobSet support it may not create JobSets,
    so a JobSet's ThrottledJob could never be marked. Anyone else with the same rights
    is still refused."""
    release = f"adm-{uuid.uuid4().hex[:6]}"
    rendered = helm_template(release, {}, tmp_path)
    objs = install_admission(kubectl, tmp_path, release=release)
    try:
        (account,) = [o["metadata"] for o in rendered if o["kind"] == "ServiceAccount"]
        kubectl("create", "namespace", account["namespace"], check=False)
        kubectl("create", "serviceaccount", "-n", account["namespace"], account["name"])
        patcher = {"apiGroups": ["throttledjob.io"], "resources": ["throttledjobs"],
                   "verbs": ["get", "patch"]}
        author = user(cluster, kubectl, namespace, tmp_path, rules=[
            {"apiGroups": ["throttledjob.io"], "resources": ["throttledjobs"],
             "verbs": ["create", "get"]},
            {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["create"]}])
        tj = eventually_created(author, of_a_jobset(tj_manifest("handled", namespace)))
        kubectl.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                       "metadata": {"name": "patcher", "namespace": namespace},
                       "rules": [patcher]},
                      {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                       "metadata": {"name": "operator-patcher", "namespace": namespace},
                       "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                   "name": "patcher"},
                       "subjects": [{"kind": "ServiceAccount", "name": account["name"],
                                     "namespace": account["namespace"]}]})
        token = cluster.service_account_token(account["namespace"], account["name"])
        operator = Kubectl(cluster.kubeconfig_for(token, tmp_path / "operator.kubeconfig",
                                                  account["name"]))
        other = user(cluster, kubectl, namespace, tmp_path, rules=[patcher])
        def mark(as_: Kubectl, value: str) -> Any:
            patch = {"metadata": {"annotations": {"throttledjob.io/handled": value}}}
            return as_("patch", "tj", "-n", namespace, tj, "--type", "merge", "-p",
                       json.dumps(patch), check=False)

        # The policy in force (it refuses the other), then the operator's mark accepted.
        wait_for(lambda: mark(other, "other").returncode != 0, 30, interval=0.5,
                 what="the policy refusing an UPDATE by one who may not create JobSets")
        assert "may not create JobSets" in mark(other, "other").stderr
        done = mark(operator, "operator")
        assert done.returncode == 0, done.stderr
    finally:
        remove(kubectl, objs)


def with_agent_volume(name: str, namespace: str, kind: str) -> dict[str, Any]:
    """An object of `kind` whose "restricted" pods mount the GPU node agent's volume, as
    a pod that wants to cap its own board would; its pods, if any are made, held
    unscheduled (a scheduling gate)."""
    pod = tj_manifest(name, namespace)["spec"]["jobTemplate"]["spec"]["template"]
    pod["spec"]["volumes"] = [{"name": "agent", "csi": {
        "driver": NODE_CSI_DRIVER, "readOnly": True,
        "volumeAttributes": {NODE_POWER_CAP_ATTRIBUTE: "true"}}}]
    pod["spec"]["schedulingGates"] = [{"name": "throttledjob.io/test-hold"}]
    meta = {"name": name, "namespace": namespace}
    labels = {"app": name}
    job = {"template": {**pod, "spec": {**pod["spec"], "restartPolicy": "Never"}}}
    always = {"metadata": {"labels": labels}, "spec": {**pod["spec"], "restartPolicy": "Always"}}
    workload = {"replicas": 0, "selector": {"matchLabels": labels}, "template": always}
    specs = {
        "Pod": ("v1", pod["spec"]),
        "Job": ("batch/v1", job),
        "CronJob": ("batch/v1", {"schedule": "0 0 1 1 *", "suspend": True,
                                 "jobTemplate": {"spec": job}}),
        "JobSet": ("jobset.x-k8s.io/v1alpha2", {"replicatedJobs": [
            {"name": "w", "replicas": 1, "template": {"spec": job}}]}),
        "Deployment": ("apps/v1", workload),
        "ReplicaSet": ("apps/v1", workload),
        "StatefulSet": ("apps/v1", {**workload, "serviceName": name}),
        "DaemonSet": ("apps/v1", {"selector": workload["selector"], "template": always}),
        "ReplicationController": ("v1", {"replicas": 0, "selector": labels,
                                         "template": always}),
    }
    if kind == "ThrottledJob":
        tj = tj_manifest(name, namespace)
        tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["volumes"] = pod["spec"]["volumes"]
        return tj
    api, spec = specs[kind]
    return {"apiVersion": api, "kind": kind, "metadata": meta, "spec": copy.deepcopy(spec)}


POD_MAKING_KINDS = ("Pod", "Job", "CronJob", "JobSet", "Deployment", "ReplicaSet",
                    "StatefulSet", "DaemonSet", "ReplicationController", "ThrottledJob")
REFUSED = "is not one of the identities the chart names"


def test_only_named_identities_may_mount_the_gpu_node_agents_volume(
        cluster: Any, kubectl: Kubectl, crd_installed: None, jobset_controller: None,
        namespace: str, tmp_path: Path) -> None:
    """The volume's attribute is the agent's word that a pod may cap its GPU. Judged by
    the real API server for every kind that makes pods: an editor, a ServiceAccount with
    a wildcard Role (every verb on every resource of the namespace), and a cluster admin
    are refused each; an identity the chart names (gpu.nodeAgent.volumeUsers) makes a
    Job whose pod the Job controller, named too, makes. An ephemeral container mounting
    the volume is refused; one without it is not. An update keeping the volume passes
    (Kueue's), one making powerCap "true" does not."""
    release = f"agent-{uuid.uuid4().hex[:6]}"
    granted_name = f"granted-{uuid.uuid4().hex[:6]}"
    kubectl("create", "serviceaccount", "-n", namespace, granted_name)
    granted_user = f"system:serviceaccount:{namespace}:{granted_name}"
    objs = [o for o in helm_template(release, {"gpu": {"nodeAgent": {
                "enabled": True, "volumeUsers": [granted_user]}}}, tmp_path)
            if o["metadata"]["name"] == f"{release}-throttledjob-node-agent-volume"]
    assert {o["kind"] for o in objs} == {"ValidatingAdmissionPolicy",
                                         "ValidatingAdmissionPolicyBinding"}
    kubectl.apply(*objs)
    try:
        everything = [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]
        wildcard = user(cluster, kubectl, namespace, tmp_path, rules=everything)
        editor = user(cluster, kubectl, namespace, tmp_path, cluster_role="edit")
        kubectl.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                       "metadata": {"name": "extra", "namespace": namespace},
                       "rules": [{"apiGroups": ["jobset.x-k8s.io", "throttledjob.io"],
                                  "resources": ["jobsets", "throttledjobs"],
                                  "verbs": ["create", "delete", "get", "patch", "update"]}]})
        kubectl("create", "rolebinding", "-n", namespace, "extra", "--role=extra",
                f"--serviceaccount={namespace}:{editor.kubeconfig.stem}")
        eventually_refused(wildcard, with_agent_volume("wild", namespace, "Pod"), REFUSED)
        for kind in POD_MAKING_KINDS:
            eventually_refused(editor, with_agent_volume(f"e-{kind.lower()}", namespace, kind),
                               REFUSED)
        refused = create(kubectl, with_agent_volume("admins", namespace, "Pod"))
        assert not refused[0] and REFUSED in refused[1], refused
        # Without the volume, the policy's expressions hold for every kind it sees.
        for kind in POD_MAKING_KINDS:
            clean = with_agent_volume(f"clean-{kind.lower()}", namespace, kind)
            for spec in _pod_specs(clean):
                del spec["volumes"]
            eventually_created(editor, clean)

        kubectl.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                       "metadata": {"name": granted_name, "namespace": namespace},
                       "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                   "kind": "ClusterRole", "name": "edit"},
                       "subjects": [{"kind": "ServiceAccount", "name": granted_name,
                                     "namespace": namespace}]})
        kubectl("create", "rolebinding", "-n", namespace, "granted-extra", "--role=extra",
                f"--serviceaccount={namespace}:{granted_name}")
        token = cluster.service_account_token(namespace, granted_name)
        granted = Kubectl(cluster.kubeconfig_for(token, tmp_path / "granted.kubeconfig",
                                                 granted_name))
        eventually_created(granted, with_agent_volume("granted", namespace, "Job"))
        wait_json(kubectl, lambda o: o["items"], "pods", "-n", namespace,
                  "-l", "job-name=granted", what="the Job controller to make the Job's pod")
        eventually_created(granted, with_agent_volume("debugged", namespace, "Pod"))

        def debug(mount: bool) -> Any:
            container = {"name": f"debug-{int(mount)}", "image": "busybox",
                         "securityContext": {"allowPrivilegeEscalation": False,
                                             "runAsNonRoot": True, "runAsUser": 1000,
                                             "capabilities": {"drop": ["ALL"]},
                                             "seccompProfile": {"type": "RuntimeDefault"}}}
            if mount:
                container["volumeMounts"] = [{"name": "agent", "mountPath": "/agent"}]
            return kubectl("patch", "pod", "-n", namespace, "debugged",
                           "--subresource=ephemeralcontainers", "--type=strategic", "-p",
                           json.dumps({"spec": {"ephemeralContainers": [container]}}),
                           check=False)

        mounting = debug(True)
        assert mounting.returncode != 0 and REFUSED in mounting.stderr, mounting.stderr
        plain = debug(False)
        assert plain.returncode == 0, plain.stderr

        # The granted JobSet, suspended as Kueue holds it, says "false".
        jobset = with_agent_volume("granted-jobset", namespace, "JobSet")
        jobset["spec"]["suspend"] = True
        template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
        template["spec"]["volumes"][0]["csi"]["volumeAttributes"][
            NODE_POWER_CAP_ATTRIBUTE] = "false"
        eventually_created(granted, jobset)
        # Kueue's kind of update (labels, a nodeSelector) keeps the volume: allowed.
        path = "/spec/replicatedJobs/0/template/spec/template/spec"
        editor("patch", "-n", namespace, "jobset", "granted-jobset", "--type=json", "-p",
               json.dumps([{"op": "add", "path": f"{path}/nodeSelector",
                            "value": {"queued": "yes"}}]))
        changed = editor("patch", "-n", namespace, "jobset", "granted-jobset", "--type=json",
                         "-p", json.dumps([{
                             "op": "replace", "value": "true",
                             "path": f"{path}/volumes/0/csi/volumeAttributes/"
                                     f"{NODE_POWER_CAP_ATTRIBUTE}"}]), check=False)
        assert changed.returncode != 0 and REFUSED in changed.stderr, changed.stderr
    finally:
        remove(kubectl, objs)


def _pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"]
    if obj["kind"] == "Pod":
        return [spec]
    if obj["kind"] == "CronJob":
        return [spec["jobTemplate"]["spec"]["template"]["spec"]]
    if obj["kind"] == "JobSet":
        return [r["template"]["spec"]["template"]["spec"] for r in spec["replicatedJobs"]]
    if obj["kind"] == "ThrottledJob":
        return [spec["jobTemplate"]["spec"]["template"]["spec"]]
    return [spec["template"]["spec"]]
