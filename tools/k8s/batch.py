"""Optional batch components beside the test cluster: Kueue, JobSet and Kubeflow Trainer.

Each is the project's own manager built from its Go module (tools/k8s/build.sh
--with-kueue/--with-jobset, cached in ~/.cache/throttledjob/batch), run as a host
process of the cluster (`Cluster.start_process`: `down` stops it) with the admin
kubeconfig, its CRDs taken from the module (CRDS), and its webhooks served on loopback
with a certificate of a CA made here: the module's webhook manifests (WEBHOOKS), their
service references turned into `https://127.0.0.1:<port><path>` with that CA as
caBundle.

    python -m tools.k8s.cluster up --with-kueue --with-jobset --with-trainer
    python -m tools.k8s.cluster build --with-kueue --with-jobset --with-trainer

Kueue manages batch/v1 Jobs (and JobSets when JobSet is on) that carry the label
kueue.x-k8s.io/queue-name, never one without it; no leader election, no internal
certificate management, no visibility API server. Stdlib only (YAML goes through the
built kubectl).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.k8s.host import cache_dir, free_port, run
from tools.k8s.host import versions as host_versions

if TYPE_CHECKING:
    from tools.k8s.cluster import Cluster

HERE = Path(__file__).resolve().parent
KUEUE, JOBSET, TRAINER = "kueue", "jobset", "trainer"
# The order they start in: Kueue looks for JobSet's CRD; Trainer renders TrainJobs into
# JobSets.
COMPONENTS = (JOBSET, KUEUE, TRAINER)
MODULES = {KUEUE: "sigs.k8s.io/kueue", JOBSET: "sigs.k8s.io/jobset",
           TRAINER: "github.com/kubeflow/trainer/v2"}
VERSION_KEYS = {KUEUE: "KUEUE_VERSION", JOBSET: "JOBSET_VERSION", TRAINER: "TRAINER_VERSION"}
# Where each module keeps its CRDs and its webhooks' manifests.
CRDS = {KUEUE: "config/components/crd/bases", JOBSET: "config/components/crd/bases",
        TRAINER: "manifests/base/crds"}
WEBHOOKS = {KUEUE: "config/components/webhook/manifests.yaml",
            JOBSET: "config/components/webhook/manifests.yaml",
            TRAINER: "manifests/base/webhook/manifests.yaml"}
KUEUE_NAMESPACE = "kueue-system"
# Kueue reads its metrics server's certificate from this fixed path when it does not
# manage certificates itself (cmd/kueue/main.go); nothing else there is used.
KUEUE_METRICS_CERTS = Path("/etc/kueue/metrics/certs")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
# What the webhook kustomizations of the modules add to the generated manifests: Kueue's
# framework webhooks skip kube-system and its own namespace; JobSet's pod webhooks only
# see pods of a JobSet (config/components/webhook/{kustomization,patches} of each).
SYSTEM_NAMESPACES = {"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                                           "operator": "NotIn",
                                           "values": ["kube-system", KUEUE_NAMESPACE]}]}
JOBSET_PODS = {"matchExpressions": [{"key": JOBSET_NAME_LABEL, "operator": "Exists"}]}


def versions() -> dict[str, str]:
    """Each component's pinned version, by name."""
    pinned = host_versions()
    return {name: pinned[key] for name, key in VERSION_KEYS.items()}


def binary(name: str) -> Path:
    return cache_dir() / "batch" / f"{name}-{versions()[name]}"


def ordered(names: Iterable[str]) -> list[str]:
    """`names` in the order they start, with what they need (Trainer's TrainJobs run as
    JobSets)."""
    wanted = set(names)
    if TRAINER in wanted:
        wanted.add(JOBSET)
    unknown = wanted - set(COMPONENTS)
    if unknown:
        raise ValueError(f"unknown batch components: {sorted(unknown)}")
    return [n for n in COMPONENTS if n in wanted]


def build(names: Iterable[str]) -> None:
    """Build (or find in the cache) the managers of `names`."""
    flags = [f"--with-{n}" for n in ordered(names)]
    if flags:
        subprocess.run(["bash", str(HERE / "build.sh"), *flags], check=True,
                       stdout=subprocess.DEVNULL)


def module_dir(name: str) -> Path:
    """The module's source in GOMODCACHE (downloaded by the build; again if cleaned)."""
    out = run("go", "mod", "download", "-json", f"{MODULES[name]}@{versions()[name]}").stdout
    return Path(json.loads(out)["Dir"])


# --- running ---------------------------------------------------------------------------------

def running(cluster: Cluster, name: str) -> bool:
    """`name` was started on this cluster and answers its readiness probe."""
    info = cluster.state.get("batch", {}).get(name)
    if not info or name not in cluster.state["pids"]:
        return False
    return _ready(info["ports"]["health"])


def start(cluster: Cluster, names: Iterable[str], timeout: float = 120.0) -> list[str]:
    """Start the components of `names` that are not running yet (CRDs, manager,
    webhooks) and return once the API server calls their webhooks; returns those it
    started."""
    wanted, started, restarted = ordered(names), [], []
    try:
        _start(cluster, wanted, started, restarted, timeout)
    except BaseException:
        # Half a component is worse than none: its webhooks would refuse what they match.
        stop(cluster, [*started, *restarted])
        raise
    return started


def _start(cluster: Cluster, wanted: list[str], started: list[str], restarted: list[str],
           timeout: float) -> None:
    frameworks = cluster.state.get("batch", {}).get(KUEUE, {}).get("frameworks", [])
    if {JOBSET, KUEUE} <= set(wanted) and running(cluster, KUEUE) \
            and "jobset.x-k8s.io/jobset" not in frameworks:
        # A Kueue started without JobSet manages no JobSet: it starts again after JobSet
        # (and stays running: it is not one of those this call started).
        stop(cluster, [KUEUE])
        if not running(cluster, JOBSET):
            started.append(JOBSET)
            _start_one(cluster, JOBSET, timeout)
        restarted.append(KUEUE)
        _start_one(cluster, KUEUE, timeout)
    for name in wanted:
        if running(cluster, name):
            continue
        started.append(name)
        _start_one(cluster, name, timeout)


def stop(cluster: Cluster, names: Iterable[str]) -> None:
    """Stop components: their webhook configurations go first (the API server would
    refuse what they match while nothing answers), then the process. CRDs and their
    objects stay; Kueue's conversion webhook is taken off its CRDs."""
    for name in reversed(ordered(names)):
        info = cluster.state.get("batch", {}).get(name)
        if not info:
            continue
        kubectl = _kubectl(cluster)
        hooks = (f"mutatingwebhookconfiguration/{name}-mutating",
                 f"validatingwebhookconfiguration/{name}-validating")
        kubectl("delete", "--ignore-not-found", *hooks)
        left = kubectl("get", "--ignore-not-found", "-o", "name", *hooks).stdout.split()
        if left:
            raise RuntimeError(f"{name}'s webhooks outlived it: {left}")
        for crd in info.get("conversion", []):
            kubectl("patch", "crd", crd, "--type", "json", "-p", json.dumps(
                [{"op": "replace", "path": "/spec/conversion", "value": {"strategy": "None"}}]))
        cluster.stop_process(name)
        batch = dict(cluster.state.get("batch", {}))
        batch.pop(name, None)
        cluster.update_state(batch=batch)


def _start_one(cluster: Cluster, name: str, timeout: float) -> None:
    program = binary(name)
    if not program.exists():
        raise RuntimeError(f"{program} is not built: tools/k8s/build.sh --with-{name}")
    kubectl = _kubectl(cluster)
    source = module_dir(name)
    certs = _certs(cluster.dir / "batch-certs")
    ports = {k: free_port() for k in ("webhook", "health", "metrics")}
    # The CRDs' files alone (Trainer's directory also holds its kustomization).
    bases = [str(p) for p in sorted((source / CRDS[name]).glob("*.yaml"))
             if p.name != "kustomization.yaml"]
    kubectl("apply", "--server-side", "--force-conflicts", *[f"-f={b}" for b in bases])
    crds = [c["metadata"]["name"] for b in bases for c in _objects(kubectl, Path(b))]
    kubectl("wait", "--for=condition=Established", "--timeout=60s",
            *[f"crd/{c}" for c in crds])
    config = cluster.dir / f"{name}-config.yaml"
    if name == KUEUE:
        kubectl("create", "namespace", KUEUE_NAMESPACE, check=False)
        _kueue_metrics_certs(certs)
        frameworks = ["batch/job"]
        if JOBSET in cluster.state.get("batch", {}):
            frameworks.append("jobset.x-k8s.io/jobset")
        config.write_text(json.dumps(_kueue_config(ports, certs, frameworks), indent=1))
        args = ["--config", str(config), "--feature-gates", "VisibilityOnDemand=false"]
    else:
        maker = _jobset_config if name == JOBSET else _trainer_config
        config.write_text(json.dumps(maker(ports, certs), indent=1))
        args = ["--config", str(config)]
    started = time.monotonic()
    cluster.start_process(name, [*args, "--kubeconfig", str(cluster.kubeconfig)],
                          str(program), env=_trainer_env(cluster, certs)
                          if name == TRAINER else None)
    cluster.update_state(batch={**cluster.state.get("batch", {}),
                                name: {"ports": ports, "frameworks": frameworks
                                       if name == KUEUE else []}})
    cluster.wait(lambda: _ready(ports["health"]), timeout, f"{name} /readyz")
    url = f"https://127.0.0.1:{ports['webhook']}"
    ca = (certs / "ca.crt").read_bytes()
    webhooks = _webhook_configurations(kubectl, source, name, url, ca, frameworks
                                       if name == KUEUE else [])
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": webhooks}))
    conversion = _conversion_crds(source) if name == KUEUE else []
    batch = cluster.state.get("batch", {})
    batch[name]["conversion"] = conversion
    cluster.update_state(batch=batch)
    for crd in conversion:
        kubectl("patch", "crd", crd, "--type", "merge", "-p", json.dumps({"spec": {
            "conversion": {"strategy": "Webhook", "webhook": {
                "conversionReviewVersions": ["v1"],
                "clientConfig": {"url": f"{url}/convert",
                                 "caBundle": _b64(ca)}}}}}))
    probe = {KUEUE: _kueue_probe, JOBSET: _jobset_probe, TRAINER: _trainer_probe}[name]
    cluster.wait(lambda: probe(kubectl), timeout, f"the API server calling {name}'s webhooks")
    batch[name]["start_seconds"] = round(time.monotonic() - started, 1)
    cluster.update_state(batch=batch)


def _kueue_config(ports: dict[str, int], certs: Path, frameworks: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['health']}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports['metrics']}"},
        "webhook": {"port": ports["webhook"], "host": "127.0.0.1", "certDir": str(certs)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": frameworks},
    }


def _jobset_config(ports: dict[str, int], certs: Path) -> dict[str, Any]:
    return {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['health']}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports['metrics']}"},
        "webhook": {"port": ports["webhook"], "host": "127.0.0.1", "certDir": str(certs)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
    }


def _trainer_config(ports: dict[str, int], certs: Path) -> dict[str, Any]:
    """Trainer reads its webhook's certificate from controller-runtime's default place
    (_trainer_env), not from its configuration."""
    return {
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1", "kind": "Configuration",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['health']}",
                   "readinessEndpointName": "readyz", "livenessEndpointName": "healthz"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports['metrics']}", "secureServing": False},
        "webhook": {"port": ports["webhook"], "host": "127.0.0.1"},
        "leaderElection": {"leaderElect": False},
        "certManagement": {"enable": False},
    }


def _trainer_env(cluster: Cluster, certs: Path) -> dict[str, str]:
    """The environment of Trainer's manager: controller-runtime looks for the webhook's
    certificate in $TMPDIR/k8s-webhook-server/serving-certs, one of this cluster's."""
    tmp = cluster.dir / "trainer-tmp"
    serving = tmp / "k8s-webhook-server" / "serving-certs"
    serving.mkdir(parents=True, exist_ok=True)
    for f in ("tls.crt", "tls.key"):
        (serving / f).write_bytes((certs / f).read_bytes())
    return {**os.environ, "TMPDIR": str(tmp)}


def _webhook_configurations(kubectl: Any, source: Path, name: str, url: str, ca: bytes,
                            frameworks: list[str]) -> list[dict[str, Any]]:
    """The module's webhook manifests, pointed at `url`, reduced to what the manager
    serves: for Kueue its own API and the frameworks it manages (the others' paths are
    not registered, and a webhook that answers 404 would refuse every pod or
    Deployment), for JobSet all of them."""
    groups = {"kueue.x-k8s.io"}
    if "batch/job" in frameworks:
        groups.add("batch")
    if "jobset.x-k8s.io/jobset" in frameworks:
        groups.add("jobset.x-k8s.io")
    out = []
    for obj in _objects(kubectl, source / WEBHOOKS[name]):
        kind = "mutating" if obj["kind"].startswith("Mutating") else "validating"
        hooks = []
        for hook in obj["webhooks"]:
            rule_groups = {g for r in hook["rules"] for g in r["apiGroups"]}
            if name == KUEUE and not rule_groups <= groups:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": url + path, "caBundle": _b64(ca)}
            if name == KUEUE and rule_groups != {"kueue.x-k8s.io"}:
                hook["namespaceSelector"] = SYSTEM_NAMESPACES
            if name == JOBSET and "" in rule_groups:
                hook["objectSelector"] = JOBSET_PODS
            hooks.append(hook)
        out.append({"apiVersion": "admissionregistration.k8s.io/v1", "kind": obj["kind"],
                    "metadata": {"name": f"{name}-{kind}"}, "webhooks": hooks})
    return out


def _conversion_crds(source: Path) -> list[str]:
    """The CRDs whose conversion webhook Kueue's CRD kustomization enables."""
    text = (source / "config" / "components" / "crd" / "kustomization.yaml").read_text()
    return [f"{plural}.kueue.x-k8s.io"
            for plural in re.findall(r"^- path: patches/webhook_in_(\w+)\.yaml", text, re.M)]


def _kueue_probe(kubectl: Any) -> bool:
    """Kueue's Job webhook suspends a Job with a queue name (a dry run: nothing stays)."""
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"generateName": "kueue-probe-", "namespace": "default",
                        "labels": {QUEUE_LABEL: "probe"}},
           "spec": {"suspend": False, "template": {"spec": {
               "restartPolicy": "Never", "containers": [{"name": "c", "image": "probe"}]}}}}
    out = kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                  stdin=json.dumps(job), check=False)
    return out.returncode == 0 and json.loads(out.stdout)["spec"].get("suspend") is True


def _jobset_probe(kubectl: Any) -> bool:
    """JobSet's webhook sets network.enableDNSHostnames, which its CRD leaves unset."""
    jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
              "metadata": {"generateName": "jobset-probe-", "namespace": "default"},
              "spec": {"replicatedJobs": [{"name": "r", "replicas": 1, "template": {
                  "spec": {"template": {"spec": {
                      "containers": [{"name": "c", "image": "probe"}]}}}}}]}}
    out = kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                  stdin=json.dumps(jobset), check=False)
    if out.returncode != 0:
        return False
    return (json.loads(out.stdout)["spec"].get("network") or {}).get("enableDNSHostnames") is True


def _trainer_probe(kubectl: Any) -> bool:
    """Trainer's TrainJob validator refuses a TrainJob whose runtime is not there (a dry
    run: nothing stays)."""
    trainjob = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "metadata": {"generateName": "trainer-probe-", "namespace": "default"},
                "spec": {"runtimeRef": {"name": "throttledjob-probe-absent"}}}
    out = kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                  stdin=json.dumps(trainjob), check=False)
    return "validator.trainjob.trainer.kubeflow.org" in out.stderr


# --- helpers ---------------------------------------------------------------------------------

def _kubectl(cluster: Cluster) -> Any:
    def kubectl(*args: str, stdin: str | None = None,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        return run(str(cluster.bin / "kubectl"), "--kubeconfig", str(cluster.kubeconfig),
                   *args, input=stdin, check=check, timeout=120)
    return kubectl


def _objects(kubectl: Any, path: Path) -> list[dict[str, Any]]:
    """The objects of YAML files (a file or a directory), parsed by kubectl (which
    writes one JSON document per file, a List where a file holds several)."""
    text = kubectl("create", "--dry-run=client", "-o", "json", "-f", str(path)).stdout
    decoder, out, at = json.JSONDecoder(), [], 0
    while text[at:].strip():
        at += len(text[at:]) - len(text[at:].lstrip())
        obj, at = decoder.raw_decode(text, at)
        out.extend(obj["items"] if obj.get("kind") == "List" else [obj])
    return out


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError):
        return False


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _certs(directory: Path) -> Path:
    """A CA of this cluster's and a serving certificate for 127.0.0.1 it signed (one
    pair for every component); made once per cluster directory."""
    if (directory / "tls.crt").exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    d = str(directory)
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30",
        "-subj", "/CN=throttledjob-batch-ca", "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.crt")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
        "-keyout", f"{d}/tls.key", "-out", f"{d}/tls.csr")
    (directory / "ext.cnf").write_text(
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    run("openssl", "x509", "-req", "-in", f"{d}/tls.csr", "-CA", f"{d}/ca.crt",
        "-CAkey", f"{d}/ca.key", "-CAcreateserial", "-days", "30",
        "-extfile", f"{d}/ext.cnf", "-out", f"{d}/tls.crt.tmp")
    (directory / "tls.crt.tmp").rename(directory / "tls.crt")
    return directory


def _kueue_metrics_certs(certs: Path) -> None:
    """Kueue exits without a certificate at KUEUE_METRICS_CERTS; one is put there if
    none is (its metrics are served on loopback only and nothing here reads them)."""
    if (KUEUE_METRICS_CERTS / "tls.crt").exists():
        return
    with contextlib.suppress(FileExistsError):
        KUEUE_METRICS_CERTS.mkdir(parents=True)
    for f in ("tls.key", "tls.crt"):
        (KUEUE_METRICS_CERTS / f).write_bytes((certs / f).read_bytes())
