"""The real control plane (tools/k8s/cluster.py) for the tests that need Kubernetes itself.

One cluster per session: the one `make cluster` left running (.cluster/) if it answers,
else one of the session's own, built from source on first use and removed at the end.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT, require_tool, wait_for
from throttledjob.operator import crd

from ..chart.conftest import CHART
from ..operator.conftest import FakeSidecar, OperatorProcess, make_tj

_spec = importlib.util.spec_from_file_location("k8s_cluster", ROOT / "tools/k8s/cluster.py")
k8s = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(k8s)  # type: ignore[union-attr]

node_mod = k8s.node_module()

OPERATOR_NAMESPACE = "throttledjob-system"
TIMEOUT = 60.0
REAL_NODE_START_TIMEOUT = 600.0  # a cold start builds the images (about 5 minutes)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Any]:
    shared = k8s.Cluster(ROOT / ".cluster")
    if shared.running():
        yield shared
        return
    require_tool("go")
    require_tool("openssl")
    k8s.build()
    own = k8s.Cluster(Path(tempfile.mkdtemp(prefix="throttledjob-cluster-")))
    try:
        own.up()
        yield own
    finally:
        own.down()


@pytest.fixture(scope="module", autouse=True)
def at_the_clusters_weight(cluster: Any) -> Iterator[None]:
    """The cluster's tests run at the cluster's weight on the CPU (Cluster.adopt): with
    a busy process beside the suite, their samplers and kubectl calls fell behind the
    pods they watch (a 9-second pod ended before its first sample). Only these: the
    tests of local mode start their workloads where they were."""
    left = cluster.adopt(os.getpid())
    try:
        yield
    finally:
        if left is not None:
            cluster.release(os.getpid(), left)


@pytest.fixture(scope="session")
def real_node(cluster: Any) -> Iterator[Any]:
    """A real node (tools/k8s/node.py) beside KWOK, for the session's tests that run real
    pods on it; torn down at the end. Needs root and Debian's packages: without them the
    tests skip, or fail under CI=true (as require_tool does)."""
    missing = node_mod.missing_tools()
    if missing:
        message = (f"a real node needs {', '.join(missing)}: apt-get install "
                   f"{' '.join(node_mod.APT_PACKAGES)} as root")
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    if cluster.state.get("node"):  # `make cluster` started one: use it, leave it
        node = node_mod.RealNode(cluster)
        if node.ready():
            yield node
            return
    node = cluster.add_real_node(REAL_NODE_START_TIMEOUT)
    yield node
    node.down()


def helm(cluster: Any, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([require_tool("helm"), "--kubeconfig", str(cluster.kubeconfig),
                           *args], capture_output=True, text=True, timeout=300)
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


@pytest.fixture(scope="session")
def kubectl(cluster: Any) -> Kubectl:
    return Kubectl(cluster.kubeconfig)


@pytest.fixture(scope="session")
def crd_installed(kubectl: Kubectl) -> None:
    """The CRD exactly as the chart ships it (charts/throttledjob/crds/)."""
    kubectl("apply", "--server-side", "-f", str(CHART / "crds"))
    kubectl("wait", "--for=condition=Established", f"crd/{crd.PLURAL}.{crd.GROUP}",
            "--timeout=60s")


@pytest.fixture
def namespace(kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace that enforces Pod Security "restricted", as a careful cluster."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")
    yield name
    kubectl("delete", "namespace", name, "--wait=false")


def helm_template(release: str, values: dict[str, Any], tmp: Path) -> list[dict[str, Any]]:
    path = tmp / f"{release}-values.yaml"
    path.write_text(yaml.safe_dump(values))
    proc = subprocess.run([require_tool("helm"), "template", release, str(CHART),
                           "--namespace", OPERATOR_NAMESPACE, "-f", str(path)],
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


@pytest.fixture
def real_operator(cluster: Any, kubectl: Kubectl, crd_installed: None, tmp_path: Path,
                  request: pytest.FixtureRequest) -> Iterator[OperatorProcess]:
    """The operator process, cluster-wide, as the chart's ServiceAccount with exactly the
    chart's RBAC. `op.user` is the identity to look up in the audit log."""
    kubeconfig, user, _ = operator_identity(cluster, kubectl, "tj", {}, tmp_path)
    op = OperatorProcess(kubeconfig, tmp_path)
    op.user = user  # type: ignore[attr-defined]
    yield op
    op.stop()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(f"--- operator log ---\n{op.log_text()}")


@pytest.fixture
def pod_sidecar(cluster: Any) -> Iterator[FakeSidecar]:
    """A /status server where the operator looks for a KWOK pod's sidecar: the pods' IP
    (a loopback address of the cluster's own, see tools/k8s/kwok-stages.yaml) and the
    sidecar's metrics port."""
    from throttledjob.operator.children import METRICS_PORT

    s = FakeSidecar(METRICS_PORT, host=cluster.pod_ip)
    yield s
    s.close()


def tj_manifest(name: str, namespace: str, run_for: str = "2s", **kwargs: Any) -> dict:
    """A ThrottledJob whose pods KWOK runs for `run_for` before they succeed."""
    tj = make_tj(name, **kwargs)
    tj["metadata"]["namespace"] = namespace
    template = tj["spec"]["jobTemplate"]["spec"]["template"]
    template.setdefault("metadata", {}).setdefault("annotations", {})[
        "throttledjob.io/test-run-for"] = run_for
    return tj


def wait_json(kubectl: Kubectl, predicate: Any, *args: str, what: str,
              timeout: float = TIMEOUT) -> Any:
    """Poll `kubectl get ARGS -o json` until `predicate(obj)` is truthy; returns the obj."""
    holder: dict[str, Any] = {}

    def check() -> bool:
        holder["obj"] = kubectl.json("get", *args)
        return holder["obj"] is not None and bool(predicate(holder["obj"]))

    wait_for(check, timeout, interval=0.2, what=what)
    return holder["obj"]


# --- reading a ThrottledJob's world through kubectl ---------------------------------------

def tj_status(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    return (kubectl.json("get", "tj", "-n", namespace, name) or {}).get("status") or {}


def tj_condition(kubectl: Kubectl, namespace: str, name: str, type_: str) -> dict[str, Any]:
    from throttledjob.operator.status import condition

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
