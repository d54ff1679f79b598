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
    """A Pod or a Job of a "restricted" pod that mounts the GPU node agent's volume,
    as a pod that wants to cap its own board would."""
    pod = tj_manifest(name, namespace)["spec"]["jobTemplate"]["spec"]["template"]
    pod["spec"]["volumes"] = [{"name": "agent", "csi": {
        "driver": NODE_CSI_DRIVER, "volumeAttributes": {NODE_POWER_CAP_ATTRIBUTE: "true"}}}]
    meta = {"name": name, "namespace": namespace}
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod["spec"]}
    job = {"template": {**pod, "spec": {**pod["spec"], "restartPolicy": "Never"}}}
    if kind == "Job":
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": job}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": meta,
            "spec": {"replicatedJobs": [{"name": "w", "replicas": 1,
                                         "template": {"spec": job}}]}}


def test_only_the_operators_pods_may_mount_the_gpu_node_agents_volume(
        cluster: Any, kubectl: Kubectl, jobset_controller: None, namespace: str,
        tmp_path: Path) -> None:
    """The volume's attribute is the agent's word that a pod may cap its GPU: a user who
    may create Pods, Jobs and JobSets may not make one that mounts it, a Job made
    with the right (here an admin's) gets its pod from the Job controller, and a user
    granted nodeagentvolumes in the namespace may."""
    release = f"agent-{uuid.uuid4().hex[:6]}"
    objs = [o for o in helm_template(release, {"gpu": {"nodeAgent": {"enabled": True}}},
                                     tmp_path)
            if o["metadata"]["name"] == f"{release}-throttledjob-node-agent-volume"]
    assert {o["kind"] for o in objs} == {*ADMISSION_KINDS, "ClusterRoleBinding"}
    kubectl.apply(*objs)
    try:
        editor = user(cluster, kubectl, namespace, tmp_path, cluster_role="edit")
        kubectl.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                       "metadata": {"name": "jobsets", "namespace": namespace},
                       "rules": [{"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"],
                                  "verbs": ["create", "delete", "get"]}]})
        kubectl("create", "rolebinding", "-n", namespace, "jobset-maker", "--role=jobsets",
                f"--serviceaccount={namespace}:{editor.kubeconfig.stem}")
        for kind in ("Pod", "Job", "JobSet"):
            eventually_refused(editor, with_agent_volume(f"own-{kind.lower()}", namespace, kind),
                               "may not use nodeagentvolumes.throttledjob.io")
        eventually_created(kubectl, with_agent_volume("admins", namespace, "Job"))
        wait_json(kubectl, lambda o: o["items"], "pods", "-n", namespace,
                  "-l", "job-name=admins", what="the Job controller to make the Job's pod")
        # Kept on an update by the editor: only adding the volume is judged.
        editor("label", "-n", namespace, "job", "admins", "edited=yes")
        (role,) = [o["metadata"]["name"] for o in objs if o["kind"] == "ClusterRole"]
        granted = user(cluster, kubectl, namespace, tmp_path, cluster_role=role)
        kubectl("create", "rolebinding", "-n", namespace, "editor", "--clusterrole=edit",
                f"--serviceaccount={namespace}:{granted.kubeconfig.stem}")
        eventually_created(granted, with_agent_volume("granted", namespace, "Pod"))
    finally:
        remove(kubectl, objs)


def test_the_agents_volume_is_not_reached_through_a_throttledjob_a_workload_or_an_edit(
        cluster: Any, kubectl: Kubectl, crd_installed: None, jobset_controller: None,
        namespace: str, tmp_path: Path) -> None:
    """The ways around the volume's policy: a ThrottledJob whose template carries the
    volume (the operator, which may use it, would make the Job as written), a Deployment
    or CronJob (where the controllers act as system:kube-controller-manager, their pods
    would pass), and an update that keeps a volume but says powerCap "true" where it said
    "false" (a JobSet's pod template: JobSet's own webhook holds it too, after this
    policy, but not where JobSet runs without it). An editor's workloads without the
    volume, and Kueue-like updates keeping it, still pass."""
    release = f"agent-{uuid.uuid4().hex[:6]}"
    objs = [o for o in helm_template(release, {"gpu": {"nodeAgent": {"enabled": True}}},
                                     tmp_path)
            if o["metadata"]["name"] == f"{release}-throttledjob-node-agent-volume"]
    kubectl.apply(*objs)
    try:
        editor = user(cluster, kubectl, namespace, tmp_path, cluster_role="edit")
        kubectl.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                       "metadata": {"name": "tj-and-jobsets", "namespace": namespace},
                       "rules": [{"apiGroups": ["jobset.x-k8s.io", "throttledjob.io"],
                                  "resources": ["jobsets", "throttledjobs"],
                                  "verbs": ["create", "delete", "get", "patch", "update"]}]})
        kubectl("create", "rolebinding", "-n", namespace, "tj-and-jobsets",
                "--role=tj-and-jobsets",
                f"--serviceaccount={namespace}:{editor.kubeconfig.stem}")
        refused = "may not use nodeagentvolumes.throttledjob.io"
        tj = tj_manifest("own-tj", namespace)
        tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["volumes"] = \
            with_agent_volume("x", namespace, "Pod")["spec"]["volumes"]
        eventually_refused(editor, tj, refused)
        pod = with_agent_volume("x", namespace, "Job")["spec"]["template"]
        meta = {"namespace": namespace}
        labels = {"app": "agent"}
        deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                      "metadata": {**meta, "name": "own-deployment"},
                      "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                               "template": {"metadata": {"labels": labels},
                                            "spec": {**pod["spec"],
                                                     "restartPolicy": "Always"}}}}
        cronjob = {"apiVersion": "batch/v1", "kind": "CronJob",
                   "metadata": {**meta, "name": "own-cronjob"},
                   "spec": {"schedule": "0 0 1 1 *", "suspend": True,
                            "jobTemplate": {"spec": {"template": pod}}}}
        for obj in (deployment, cronjob):
            eventually_refused(editor, obj, refused)
        # Without the volume, the policy's expressions hold for every kind it sees.
        for obj in (deployment, cronjob, tj):
            clean = copy.deepcopy(obj)
            clean["metadata"]["name"] += "-clean"
            specs = [clean["spec"]["template"]["spec"]] if obj is deployment else \
                [clean["spec"]["jobTemplate"]["spec"]["template"]["spec"]]
            for spec in specs:
                del spec["volumes"]
            eventually_created(editor, clean)
        # The admin's JobSet, suspended as Kueue holds it, says "false".
        jobset = with_agent_volume("admins-jobset", namespace, "JobSet")
        jobset["spec"]["suspend"] = True
        template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
        template["spec"]["volumes"][0]["csi"]["volumeAttributes"][
            NODE_POWER_CAP_ATTRIBUTE] = "false"
        eventually_created(kubectl, jobset)
        # Kueue's kind of update (labels, a nodeSelector) keeps the volume: allowed.
        path = "/spec/replicatedJobs/0/template/spec/template/spec"
        editor("patch", "-n", namespace, "jobset", "admins-jobset", "--type=json", "-p",
               json.dumps([{"op": "add", "path": f"{path}/nodeSelector",
                            "value": {"queued": "yes"}}]))
        changed = editor("patch", "-n", namespace, "jobset", "admins-jobset", "--type=json",
                         "-p", json.dumps([{
                             "op": "replace", "value": "true",
                             "path": f"{path}/volumes/0/csi/volumeAttributes/"
                                     f"{NODE_POWER_CAP_ATTRIBUTE}"}]), check=False)
        assert changed.returncode != 0 and refused in changed.stderr, changed.stderr
    finally:
        remove(kubectl, objs)
