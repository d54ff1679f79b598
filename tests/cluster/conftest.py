"""The real control plane (tools/k8s/cluster.py) for the tests that need Kubernetes itself.

One cluster per session: the one `make cluster` left running (.cluster/) if it answers,
else one of the session's own, built from source on first use and removed at the end.
Helpers the tests share live in testing/cluster_cli.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testing.cluster_cli import Kubectl, helm, operator_identity
from testing.fake_sidecar import FakeSidecar
from testing.helpers import require_tool
from testing.operator_process import OperatorProcess
from testing.paths import CHART, ROOT
from throttledjob.operator import api_names
from tools.k8s import batch, images
from tools.k8s import cluster as k8s
from tools.k8s import node as node_mod

REAL_NODE_START_TIMEOUT = 600.0  # a cold start builds the images (about 5 minutes)
# The docs' values for the one-machine cluster (docs/install.md).
ONE_MACHINE_VALUES = ROOT / "examples/one-machine/values.yaml"


@pytest.fixture(scope="module")
def jobset_controller(cluster: Any) -> Iterator[None]:
    """JobSet alone (tools/k8s/batch.py) for one module: no Kueue webhooks there."""
    batch.build(["jobset"])
    started = batch.start(cluster, ["jobset"])
    try:
        yield
    finally:
        batch.stop(cluster, started)


@pytest.fixture(scope="module")
def trainer_controller(cluster: Any) -> Iterator[None]:
    """Kubeflow Trainer and the JobSet it renders TrainJobs into (tools/k8s/batch.py),
    for one module."""
    batch.build([batch.TRAINER])
    started = batch.start(cluster, [batch.TRAINER])
    try:
        yield
    finally:
        batch.stop(cluster, started)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Any]:
    shared = k8s.Cluster(ROOT / ".cluster")
    if shared.running():
        yield shared
        return
    require_tool("go")
    require_tool("openssl")
    k8s.build()
    own = k8s.Cluster(Path(tempfile.mkdtemp(prefix=k8s.TEMP_PREFIX)))
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


@pytest.fixture(scope="session")
def torch_image(real_node: Any) -> str:
    """The user's PyTorch image (examples/pytorch/Dockerfile) on the real node."""
    real_node.load(images.torch_archive())  # built once, cached (about 1.3 GB)
    return images.TORCH_IMAGE


@pytest.fixture(scope="module")
def operator(cluster: Any, kubectl: Kubectl, real_node: Any,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The chart installed, its operator running on the real node and watching one
    namespace ("restricted"); yields that namespace."""
    release = f"e2e-{uuid.uuid4().hex[:6]}"
    system, watched = f"{release}-system", f"{release}-jobs"
    for ns in (system, watched):
        kubectl("create", "namespace", ns)
        kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    try:
        # The docs' values for this cluster, and one namespace to watch.
        ours = tmp_path_factory.mktemp("e2e") / "values.yaml"
        # JobSet's calls too: tests/cluster/test_distributed_live.py runs a JobSet.
        # Attach mode's webhook too: the TrainJob's test there.
        ours.write_text(json.dumps({"watchNamespaces": [watched],  # JSON is YAML
                                    "operator": {"statusIntervalSeconds": 2},
                                    "jobset": {"enabled": True},
                                    "attach": {"enabled": True}}))
        helm(cluster, "install", release, str(CHART), "-n", system,
             "-f", str(ONE_MACHINE_VALUES), "-f", str(ours), "--wait", "--timeout", "180s")
        yield watched
    finally:
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            helm(cluster, "uninstall", release, "-n", system, "--wait", "--timeout", "60s")
        for ns in (system, watched):
            kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture(scope="module")
def batch_components(cluster: Any) -> Iterator[Any]:
    """JobSet and Kueue (tools/k8s/batch.py) on the session's cluster, for one module's
    tests: built on first use (cached), started for the module and stopped after it, so
    no other test's Job goes through Kueue's webhooks. Ones `make cluster WITH=...`
    started are used and left running. Yields the cluster."""
    require_tool("go")
    require_tool("openssl")
    batch.build([batch.JOBSET, batch.KUEUE])
    started = batch.start(cluster, [batch.JOBSET, batch.KUEUE])
    try:
        yield cluster
    finally:
        batch.stop(cluster, started)


@pytest.fixture(scope="session")
def kubectl(cluster: Any) -> Kubectl:
    return Kubectl(cluster.kubeconfig)


@pytest.fixture(scope="session")
def crd_installed(kubectl: Kubectl) -> None:
    """The CRD exactly as the chart ships it (charts/throttledjob/crds/)."""
    kubectl("apply", "--server-side", "-f", str(CHART / "crds"))
    kubectl("wait", "--for=condition=Established", f"crd/{api_names.PLURAL}.{api_names.GROUP}",
            "--timeout=60s")


@pytest.fixture
def namespace(kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace that enforces Pod Security "restricted", as a careful cluster."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")
    yield name
    kubectl("delete", "namespace", name, "--wait=false")


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
