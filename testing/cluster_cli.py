"""The test cluster through its command-line clients: kubectl (the one built with the
cluster) and helm, as one identity or another, and what the tests read through them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from testing.chart import MONITORING_APIS
from testing.helpers import require_tool, wait_for
from testing.paths import CHART
from tools.k8s import cluster as k8s

OPERATOR_NAMESPACE = "throttledjob-system"
TIMEOUT = 60.0


def helm(cluster: Any, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([require_tool("helm"), "--kubeconfig", str(cluster.kubeconfig),
                           *args], capture_output=True, text=True, timeout=300)
    if not check:
        return proc
    if proc.returncode != 0 and "-n" in args:
        # helm --wait says only "context deadline exceeded": say which pods and why.
        pods = Kubectl(cluster.kubeconfig).json("get", "pods", "-n", args[args.index("-n") + 1])
        stuck = [f"{p['metadata']['name']}: {why_not(p)}" for p in (pods or {}).get("items", [])]
        proc.stderr += " | ".join(stuck)
    assert proc.returncode == 0, f"helm {' '.join(args)}: {proc.stdout}{proc.stderr}"
    return proc


class Kubectl:
    """The kubectl built with the cluster, as one identity (a kubeconfig)."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig

    def __call__(self, *args: str, stdin: str | None = None,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(k8s.bin_dir() / "kubectl"), "--kubeconfig",
                               str(self.kubeconfig), *args], input=stdin, capture_output=True,
                              text=True, timeout=120)
        if check:
            assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"
        return proc

    def json(self, *args: str) -> Any:
        proc = self(*args, "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def apply(self, *objs: dict[str, Any], check: bool = True) -> subprocess.CompletedProcess:
        return self("apply", "-f", "-", stdin=yaml.safe_dump_all(objs), check=check)


def helm_template(release: str, values: dict[str, Any], tmp: Path) -> list[dict[str, Any]]:
    path = tmp / f"{release}-values.yaml"
    path.write_text(yaml.safe_dump(values))
    proc = subprocess.run([require_tool("helm"), "template", release, str(CHART),
                           "--namespace", OPERATOR_NAMESPACE, *MONITORING_APIS, "-f", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def operator_identity(cluster: Any, kubectl: Kubectl, release: str, values: dict[str, Any],
                      tmp: Path) -> tuple[Path, str, list[dict[str, Any]]]:
    """Apply the ServiceAccount and RBAC objects the chart renders for `values`; returns a
    kubeconfig holding that ServiceAccount's token, its user name, and the RBAC objects."""
    objs = [o for o in helm_template(release, values, tmp) if o["kind"] in RBAC_KINDS]
    kubectl("create", "namespace", OPERATOR_NAMESPACE, check=False)
    kubectl.apply(*objs)
    (sa,) = [o for o in objs if o["kind"] == "ServiceAccount"]
    name = sa["metadata"]["name"]
    token = cluster.service_account_token(OPERATOR_NAMESPACE, name)
    user = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{name}"
    return cluster.kubeconfig_for(token, tmp / f"{release}.kubeconfig"), user, objs


def wait_json(kubectl: Kubectl, predicate: Any, *args: str, what: str,
              timeout: float = TIMEOUT) -> Any:
    """Poll `kubectl get ARGS -o json` until `predicate(obj)` is truthy; returns the obj."""
    holder: dict[str, Any] = {}

    def check() -> bool:
        holder["obj"] = kubectl.json("get", *args)
        return holder["obj"] is not None and bool(predicate(holder["obj"]))

    try:
        wait_for(check, timeout, interval=0.2, what=what)
    except pytest.fail.Exception as timed_out:
        pytest.fail(f"{timed_out.msg}; last seen: {why_not(holder.get('obj'))}")
    return holder["obj"]


def why_not(obj: dict[str, Any] | None) -> str:
    """One line on where an object stands: its phase, the conditions not True with their
    reasons, its containers' waiting reasons (a pod Pending on a tainted node, an image
    it cannot pull), so a timed-out wait in CI's log says why."""
    if not obj:
        return "not found"
    status = obj.get("status") or {}
    parts = [f"phase {status['phase']}"] if status.get("phase") else []
    parts += [f"{c['type']}={c['status']} {c.get('reason', '')}: {c.get('message', '')}"
              for c in status.get("conditions") or [] if c.get("status") != "True"]
    for c in status.get("containerStatuses") or []:
        state = c.get("state") or {}
        for how in ("waiting", "terminated"):
            if how in state:
                parts.append(f"{c['name']} {how} {state[how].get('reason', '')}")
    return "; ".join(parts)[:600] or "no status"


def job_finished(kubectl: Kubectl, namespace: str, name: str, timeout: float) -> Any:
    """The Job `name` once it is Complete or Failed; it may not exist yet (an operator
    creates a ThrottledJob's)."""
    return wait_json(kubectl, lambda j: any(
        c["type"] in ("Complete", "Failed") and c["status"] == "True"
        for c in (j.get("status") or {}).get("conditions") or []),
        "job", "-n", namespace, name, what=f"job {name} to finish", timeout=timeout)


# --- reading a ThrottledJob's world through kubectl ---------------------------------------

def tj_status(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    return (kubectl.json("get", "tj", "-n", namespace, name) or {}).get("status") or {}


def tj_condition(kubectl: Kubectl, namespace: str, name: str, type_: str) -> dict[str, Any]:
    from throttledjob.operator.conditions import condition

    return condition(tj_status(kubectl, namespace, name), type_) or {}


def tj_events(kubectl: Kubectl, namespace: str, name: str) -> list[tuple[str, str]]:
    events = kubectl.json("get", "events", "-n", namespace) or {"items": []}
    return [(e.get("type"), e.get("reason")) for e in events["items"]
            if e.get("involvedObject", {}).get("name") == name]


def jobs_of(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    from throttledjob.operator.children import LABEL_NAME

    listed = kubectl.json("get", "jobs", "-n", namespace, "-l", f"{LABEL_NAME}={name}")
    return (listed or {}).get("items") or []


def policy_of(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    cm = kubectl.json("get", "configmap", "-n", namespace, f"{name}-throttle")
    return yaml.safe_load(cm["data"]["policy.yaml"]) if cm else {}
