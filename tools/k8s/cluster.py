"""A real Kubernetes control plane on loopback, for `make cluster` and the test suite.

etcd, kube-apiserver (RBAC, Pod Security and ServiceAccount admission, real token
signing), kube-controller-manager (the Job, garbage-collector, namespace and
ServiceAccount controllers among its defaults), kube-scheduler, and KWOK playing one
node: it marks scheduled pods Running and a Job's pods Succeeded, as a kubelet whose
containers exit 0 would. Every binary is built from source by tools/k8s/build.sh.

    python -m tools.k8s.cluster up [--dir .cluster]     start, wait until ready, return
    python -m tools.k8s.cluster down [--dir .cluster]   stop everything, remove the dir

Stdlib only. Ports are picked free at start, so two clusters never clash; everything a
cluster makes lives in its directory and goes with `down`.

    python -m tools.k8s.cluster up --node real          also a real node beside KWOK: a
                                                        kubelet on containerd running real
                                                        pods (tools/k8s/node.py)
    python -m tools.k8s.cluster up --with-kueue --with-jobset
                                                        also Kueue and JobSet, built from
                                                        their modules (tools/k8s/batch.py)

Run from the repository root (the module is `tools.k8s.cluster`).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tools.k8s import batch, images
from tools.k8s import node as real_node
from tools.k8s.host import cache_dir, cgroup_mounts, cpu_mount, free_port, run, versions

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
NODE_NAME = "kwok-node-0"
# Only pods that ask for KWOK's node land there (the suite's fast tests, whose images
# exist nowhere): a pod with no node selector goes to a real node, if there is one.
KWOK_TAINT = {"key": "throttledjob.io/kwok", "value": "true", "effect": "NoSchedule"}
KWOK_LABELS = {"type": "kwok"}
ON_KWOK: dict[str, Any] = {"nodeSelector": KWOK_LABELS,
                           "tolerations": [{**KWOK_TAINT, "operator": "Equal"}]}
SERVICE_CIDR = "10.96.0.0/16"
ADMIN = "admin"
# The cluster's weight on the machine's CPU (cgroup v1 cpu.shares; a lone process has
# 1024): its daemons and a real node's pods get the machine as a real node's do, and a
# build or a second test run beside it takes a ninth of a core, not half the machine.
# With the default weight, one busy process on the host left the node's pods one core
# of two (measured: 0.95 cores; with this weight, 1.55 beside a Go build).
CPU_SHARES = 8192
# What ServiceAccounts do, as the API server saw and judged it: tests compare the calls
# the operator made with what its RBAC grants.
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
  - level: None
"""


def bin_dir() -> Path:
    return cache_dir() / "k8s" / versions()["K8S_VERSION"] / "bin"


def build(components: list[str] | tuple[str, ...] = ()) -> Path:
    """Build (or find in the cache) every binary, and the batch managers of `components`
    in the same pass (build.sh); returns the cluster's bin directory."""
    flags = [f"--with-{n}" for n in batch.ordered(components)]
    subprocess.run(["bash", str(HERE / "build.sh"), *flags], check=True,
                   stdout=subprocess.DEVNULL)
    return bin_dir()


class Cluster:
    """One control plane whose state lives in `directory` (pids.json says what runs)."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory).resolve()
        self.kubeconfig = self.dir / "kubeconfig"
        self.bin = bin_dir()

    # --- the admin's view -----------------------------------------------------------------

    @property
    def state(self) -> dict[str, Any]:
        return json.loads((self.dir / "state.json").read_text())

    @property
    def server(self) -> str:
        return self.state["server"]

    @property
    def admin_token(self) -> str:
        return self.state["token"]

    @property
    def service_ip(self) -> str:
        """The `kubernetes` Service's ClusterIP: the first of the service range."""
        return str(ipaddress.ip_network(SERVICE_CIDR)[1])

    @property
    def pod_ip(self) -> str:
        """The IP every pod of the KWOK node gets: a loopback address of this cluster's
        own, where a test can serve what a pod would (a sidecar's /status)."""
        return self.state["pod_ip"]

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.dir / "certs" / "apiserver.crt"))

    def request(self, method: str, path: str, body: Any = None, token: str | None = None,
                content_type: str = "application/json") -> Any:
        """One API call; returns the decoded answer, raises urllib.error.HTTPError."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.server + path, data=data, method=method,
            headers={"Authorization": f"Bearer {token or self.admin_token}",
                     "Content-Type": content_type, "Accept": "application/json"})
        with urllib.request.urlopen(req, timeout=30, context=self.ssl_context()) as resp:
            return json.loads(resp.read() or b"null")

    def running(self) -> bool:
        """The API server of this directory answers /readyz."""
        if not (self.dir / "state.json").exists():
            return False
        try:
            req = urllib.request.Request(self.server + "/readyz",
                                         headers={"Authorization": f"Bearer {self.admin_token}"})
            with urllib.request.urlopen(req, timeout=2, context=self.ssl_context()) as resp:
                return resp.status == 200
        except (OSError, ssl.SSLError):
            return False

    def issue_cert(self, name: str, subject: str, usage: str, ips: tuple[str, ...] = (),
                   dns: tuple[str, ...] = ()) -> Path:
        """A key and a certificate signed by the cluster's CA, certs/NAME.{key,crt}, for
        `usage` (serverAuth or clientAuth); returns the certificate's path."""
        certs = self.dir / "certs"
        extensions = ["-addext", "basicConstraints=critical,CA:FALSE",
                      "-addext", f"extendedKeyUsage={usage}"]
        names = [f"IP:{ip}" for ip in ips] + [f"DNS:{d}" for d in dns]
        if names:
            extensions += ["-addext", "subjectAltName=" + ",".join(names)]
        run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-nodes", "-days", "3650",
            "-CA", str(certs / "ca.crt"), "-CAkey", str(certs / "ca.key"),
            "-keyout", str(certs / f"{name}.key"), "-out", str(certs / f"{name}.crt"),
            "-subj", subject, *extensions)
        return certs / f"{name}.crt"

    def kubeconfig_for(self, token: str, path: Path, user: str = "user") -> Path:
        """A kubeconfig for another identity (a ServiceAccount's token) on this cluster."""
        ca = base64.b64encode((self.dir / "certs" / "apiserver.crt").read_bytes()).decode()
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": user,
            "clusters": [{"name": "local", "cluster": {"server": self.server,
                                                       "certificate-authority-data": ca}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": user, "context": {"cluster": "local", "user": user}}],
        }))
        return path

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """A bound token of a ServiceAccount (TokenRequest), as a pod would mount."""
        answer = self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/"
                                      f"{name}/token",
                              {"apiVersion": "authentication.k8s.io/v1",
                               "kind": "TokenRequest", "spec": {"expirationSeconds": seconds}})
        return answer["status"]["token"]

    # --- lifecycle --------------------------------------------------------------------------

    def up(self, timeout: float = 180.0) -> Cluster:
        """Start every component (in their own sessions: they outlive this process) and
        return once pods can be scheduled and completed."""
        if self.running():
            return self
        reap_abandoned(self.dir.parent)
        self.down()
        for name in ("etcd", "certs", "logs"):
            (self.dir / name).mkdir(parents=True, exist_ok=True)
        token, node_token = secrets.token_hex(16), secrets.token_hex(16)
        # The second identity is a real node's kubelet (tools/k8s/node.py), if one is added.
        node_user = f"system:node:{real_node.NODE_NAME}"
        (self.dir / "tokens.csv").write_text(
            f'{token},{ADMIN},{ADMIN},"system:masters"\n'
            f'{node_token},{node_user},{node_user},"system:nodes"\n')
        (self.dir / "audit-policy.yaml").write_text(AUDIT_POLICY)
        subprocess.run(["openssl", "genrsa", "-out", str(self.dir / "sa.key"), "2048"],
                       check=True, capture_output=True)
        # The cluster's CA: it signs a real node's serving certificate and the API
        # server's client certificate for kubelets (logs, exec), which the kubelet checks.
        certs = self.dir / "certs"
        run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-nodes", "-days", "3650",
            "-keyout", str(certs / "ca.key"), "-out", str(certs / "ca.crt"),
            "-subj", "/CN=throttledjob-cluster-ca")
        self.issue_cert("kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client",
                        usage="clientAuth")
        ports = {k: free_port() for k in ("etcd", "peer", "apiserver")}
        server = f"https://127.0.0.1:{ports['apiserver']}"
        pod_ip = "127." + ".".join(str(secrets.randbelow(254) + 1) for _ in range(3))
        (self.dir / "state.json").write_text(json.dumps(
            {"server": server, "token": token, "node_token": node_token, "ports": ports,
             "pod_ip": pod_ip, "pids": {}, "cgroup": _cpu_cgroup()}))
        (self.dir / "kwok-stages.yaml").write_text(
            (HERE / "kwok-stages.yaml").read_text().replace("POD_IP", pod_ip))
        etcd_url = f"http://127.0.0.1:{ports['etcd']}"
        self._start("etcd", [
            "--name", "default", "--data-dir", str(self.dir / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{ports['peer']}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{ports['peer']}",
            "--initial-cluster", f"default=http://127.0.0.1:{ports['peer']}",
            "--unsafe-no-fsync", "--log-level", "warn"])
        self._start("kube-apiserver", [
            "--etcd-servers", etcd_url, "--bind-address", "127.0.0.1",
            "--advertise-address", "127.0.0.1", "--secure-port", str(ports["apiserver"]),
            "--cert-dir", str(self.dir / "certs"), "--service-cluster-ip-range", SERVICE_CIDR,
            "--authorization-mode", "RBAC", "--token-auth-file", str(self.dir / "tokens.csv"),
            # As OpenShift has it: an owner reference that blocks its owner's deletion
            # needs `update` on the owner's finalizers (the operator's Job and ConfigMap).
            "--enable-admission-plugins", "OwnerReferencesPermissionEnforcement",
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(self.dir / "sa.key"),
            "--service-account-signing-key-file", str(self.dir / "sa.key"),
            "--endpoint-reconciler-type", "none", "--allow-privileged=true",
            "--audit-policy-file", str(self.dir / "audit-policy.yaml"),
            "--audit-log-path", str(self.dir / "audit.log"), "--audit-log-format", "json",
            "--storage-media-type", "application/json",
            "--kubelet-client-certificate", str(certs / "kubelet-client.crt"),
            "--kubelet-client-key", str(certs / "kubelet-client.key"),
            "--kubelet-certificate-authority", str(certs / "ca.crt"),
            # A node's name resolves nowhere here: call the kubelet at its InternalIP.
            "--kubelet-preferred-address-types", "InternalIP",
            # A webhook behind a Service (the chart's attach webhook) is called at its
            # endpoint's pod IP, which this machine reaches; no ClusterIP is routed here.
            "--enable-aggregator-routing=true", "--v", "1"])
        self._wait(lambda: (self.dir / "certs" / "apiserver.crt").exists() and self.running(),
                   timeout, "kube-apiserver /readyz")
        admin = self.kubeconfig_for(token, self.kubeconfig, ADMIN)
        self._start("kube-controller-manager", [
            "--kubeconfig", str(admin), "--leader-elect=false", "--secure-port", "0",
            "--service-account-private-key-file", str(self.dir / "sa.key"),
            "--root-ca-file", str(self.dir / "certs" / "apiserver.crt"),
            # Each controller as its own ServiceAccount, judged by its bootstrap role, as
            # in a real cluster: the Job controller's pod creates meet the chart's
            # admission policies as kube-system/job-controller, not as an admin.
            "--use-service-account-credentials=true", "--concurrent-job-syncs", "20",
            "--kube-api-qps", "200", "--kube-api-burst", "400", "--v", "1"])
        self._start("kube-scheduler", [
            "--kubeconfig", str(admin), "--leader-elect=false", "--secure-port", "0",
            "--kube-api-qps", "200", "--kube-api-burst", "400", "--v", "1"])
        self._start("kwok", [
            "--kubeconfig", str(admin), "--config", str(self.dir / "kwok-stages.yaml"),
            "--manage-all-nodes=false", "--node-lease-duration-seconds", "40",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--server-address", f"127.0.0.1:{free_port()}", "--node-ip", "127.0.0.1"])
        self._wait(self._default_service_account, timeout, "the default ServiceAccount")
        self._ensure_node()
        self._wait(self._node_ready, timeout, f"node {NODE_NAME} Ready")
        return self

    def add_real_node(self, timeout: float = 180.0) -> real_node.RealNode:
        """A real node beside KWOK (tools/k8s/node.py); returns once it is Ready. Raises
        real_node.NodeUnavailable when this machine lacks what it needs."""
        real = real_node.RealNode(self)
        try:
            real.up(timeout)
        except BaseException:
            # Half a node is worse than none: undo what was made, keep the control plane.
            real.down()
            raise
        return real

    def down(self) -> None:
        """Stop every process this directory started (SIGTERM, then SIGKILL), undo what a
        real node changed on the machine, and remove the directory."""
        state = self.dir / "state.json"
        if state.exists():
            if self.state.get("node"):
                real_node.teardown(self)
            saved = json.loads(state.read_text())
            for pid in reversed(list(saved.get("pids", {}).values())):
                _terminate(pid)
            if saved.get("cgroup"):
                _remove_cgroup(saved["cgroup"])
        shutil.rmtree(self.dir, ignore_errors=True)

    def audit(self, username: str) -> list[dict[str, Any]]:
        """Audit events of the requests `username` made, in order. The API server rotates
        its log at 100 MB (audit-<time>.log, kept): the older files are read first, so
        that an index into this list stays one across a rotation (a second run of
        bench.operator_load on one cluster read no writes at all)."""
        paths = [*sorted(self.dir.glob("audit-*.log")), self.dir / "audit.log"]
        events = (json.loads(line) for path in paths if path.exists()
                  for line in path.read_text().splitlines() if line)
        return [e for e in events if e.get("user", {}).get("username") == username]

    def restart(self, name: str) -> None:
        """Stop one component and start it again with the same flags (a crash, an
        upgrade); for the API server, returns once it answers again."""
        state = self.state
        _terminate(state["pids"][name])
        self._start(name, state["args"][name], state.get("programs", {}).get(name))
        if name == "kube-apiserver":
            self._wait(self.running, 120, "kube-apiserver /readyz after a restart")

    def update_state(self, **values: Any) -> None:
        state = self.state
        state.update(values)
        (self.dir / "state.json").write_text(json.dumps(state))

    def start_process(self, name: str, args: list[str], program: str | None = None,
                      env: dict[str, str] | None = None) -> None:
        """Start a component (a binary of the build, or `program`, in `env`); `down`
        stops it."""
        self._start(name, args, program, env)

    def stop_process(self, name: str) -> None:
        """Stop one component for good (SIGTERM, then SIGKILL); forgotten by `down`."""
        state = self.state
        pid = state["pids"].pop(name, None)
        if pid is not None:
            _terminate(pid)
        (self.dir / "state.json").write_text(json.dumps(state))

    def adopt(self, pid: int) -> str | None:
        """Run `pid` (a test runner) at the cluster's weight on the CPU, beside its
        daemons (CPU_SHARES): its kubectl calls and samplers must keep up with the node
        they watch, whatever else the machine runs. Returns the cpu cgroup it left, for
        `release`; None where the cluster has no cgroup."""
        mount, cgroup = cpu_mount(), self.state.get("cgroup")
        if mount is None or not cgroup:
            return None
        left = next((line.split(":", 2)[2] for line in
                     Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                     if "cpu" in line.split(":")[1].split(",")), "/")
        return left if self._move(pid, f"{cgroup}/system") else None

    @staticmethod
    def release(pid: int, cgroup: str) -> None:
        """Move `pid` back to the cpu cgroup `adopt` took it from (before `down`, which
        cannot remove a cgroup that still holds it)."""
        Cluster._move(pid, cgroup)

    @staticmethod
    def _move(pid: int, cgroup: str) -> bool:
        """Move `pid` into `cgroup` of the cpu hierarchy; False when it cannot be."""
        mount = cpu_mount()
        if mount is None:
            return False
        try:
            (mount / cgroup.lstrip("/") / "cgroup.procs").write_text(str(pid))
        except OSError:  # gone already
            return False
        return True

    def wait(self, ready: Any, timeout: float, what: str) -> None:
        """Poll `ready()` until true; fails early with the log of a component that died."""
        self._wait(ready, timeout, what)

    def _start(self, name: str, args: list[str], program: str | None = None,
               env: dict[str, str] | None = None) -> None:
        log = open(self.dir / "logs" / f"{name}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen([program or str(self.bin / name), *args], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=self.dir, env=env)
        log.close()
        state = json.loads((self.dir / "state.json").read_text())
        if state.get("cgroup"):
            self._move(proc.pid, f"{state['cgroup']}/system")
        state["pids"][name] = proc.pid
        state.setdefault("args", {})[name] = args
        if program:
            state.setdefault("programs", {})[name] = program
        (self.dir / "state.json").write_text(json.dumps(state))

    def _wait(self, ready: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for name, pid in self.state["pids"].items():
                if not _alive(pid):
                    log = (self.dir / "logs" / f"{name}.log").read_text(errors="replace")
                    raise RuntimeError(f"{name} exited while waiting for {what}:\n{log[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.2)

    def _default_service_account(self) -> bool:
        try:
            return bool(self.request("GET", "/api/v1/namespaces/default/serviceaccounts/default"))
        except urllib.error.HTTPError:
            return False

    def _ensure_node(self) -> None:
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": NODE_NAME, "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {"kubernetes.io/hostname": NODE_NAME, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", **KWOK_LABELS}},
            "spec": {"taints": [KWOK_TAINT]},
            # Room for the load benchmark's 1,300 pods, each held to a 1-core limit (a
            # limit with no request makes a request of it).
            "status": {"allocatable": {"cpu": "2000", "memory": "4Ti", "pods": "5000"},
                       "capacity": {"cpu": "2000", "memory": "4Ti", "pods": "5000"}}}
        with contextlib.suppress(urllib.error.HTTPError):
            self.request("POST", "/api/v1/nodes", node)

    def _node_ready(self) -> bool:
        try:
            node = self.request("GET", f"/api/v1/nodes/{NODE_NAME}")
        except urllib.error.HTTPError:
            return False
        ready = any(c["type"] == "Ready" and c["status"] == "True"
                    for c in (node.get("status") or {}).get("conditions") or [])
        # The node-lifecycle controller lifts the not-ready taint once it sees the lease.
        taints = (node.get("spec") or {}).get("taints") or []
        return ready and [t["key"] for t in taints] == [KWOK_TAINT["key"]]


def _cpu_cgroup() -> str:
    """A cgroup of CPU_SHARES for a new cluster, its daemons in `system` under it: its
    path, or "" where it cannot be made (no cgroup v1 cpu controller, not root)."""
    mount = cpu_mount()
    if mount is None:
        return ""
    path = f"/tj-cluster-{secrets.token_hex(3)}"
    try:
        (mount / path.lstrip("/") / "system").mkdir(parents=True)
        (mount / path.lstrip("/") / "cpu.shares").write_text(str(CPU_SHARES))
    except OSError:
        _remove_cgroup(path)
        return ""
    return path


def _remove_cgroup(path: str) -> None:
    """Remove the cluster's cgroup (and what a node made under it) in every hierarchy,
    deepest first; its processes are gone by now."""
    for mount in cgroup_mounts():
        top = mount / path.lstrip("/")
        for sub, _, _ in sorted(os.walk(top), key=lambda w: -len(w[0])):
            with contextlib.suppress(OSError):
                os.rmdir(sub)


TEMP_PREFIX = "throttledjob-cluster-"


def reap_abandoned(parent: Path) -> list[Path]:
    """Tear down the clusters a killed run left in `parent` (TEMP_PREFIX directories whose
    recorded processes are all gone): a real node's address on lo, bridge, mounts and
    cgroups outlive a SIGKILLed test session, and the next run's node could not start
    beside them (a CI run after a killed one failed 33 tests that way). A cluster with
    any process alive, or none recorded yet (one being started), is left alone."""
    reaped = []
    for d in sorted(parent.glob(f"{TEMP_PREFIX}*")):
        with contextlib.suppress(OSError, ValueError):
            pids = json.loads((d / "state.json").read_text()).get("pids") or {}
            if pids and not any(_alive(pid) for pid in pids.values()):
                Cluster(d).down()
                reaped.append(d)
    return reaped


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie of ours counts as gone.
    with contextlib.suppress(ChildProcessError, OSError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    return True


def _terminate(pid: int, grace: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["up", "down", "build"])
    parser.add_argument("--dir", default=str(ROOT / ".cluster"),
                        help="where the cluster's state lives (default .cluster)")
    parser.add_argument("--node", choices=["kwok", "real"], default="kwok",
                        help="real: also a real node (kubelet, containerd) beside KWOK's")
    parser.add_argument("--with-torch", action="store_true",
                        help="also load the example PyTorch image on the real node "
                             "(examples/pytorch/: 2.7 GB, built once)")
    for name in batch.COMPONENTS:
        parser.add_argument(f"--with-{name}", action="store_true",
                            help=f"also {name} (tools/k8s/batch.py), built on first use")
    parser.add_argument("--with-fake-gpus", action="store_true",
                        help="two fake nvidia.com/gpu on the real node, from a device "
                             "plugin (tools/k8s/fake_gpus.py)")
    args = parser.parse_args(argv)
    components = [n for n in batch.COMPONENTS if getattr(args, f"with_{n}")]
    if args.action == "build":
        print(build(components))
        return 0
    cluster = Cluster(Path(args.dir))
    if args.action == "down":
        cluster.down()
        return 0
    build(components)
    started = time.monotonic()
    was_running = cluster.running()
    try:
        cluster.up()
        if args.node == "real":
            real = cluster.add_real_node(timeout=900)  # a cold start builds the images
            if args.with_torch:
                real.load(images.torch_archive())
            if args.with_fake_gpus:
                real.start_fake_gpus()
        batch.start(cluster, components)
    except (RuntimeError, TimeoutError, OSError) as e:
        # A cluster that was already running keeps running (a failed node undoes itself).
        if not was_running:
            cluster.down()
        print(f"cluster: {e}", file=sys.stderr)
        return 1
    print(f"cluster ready in {time.monotonic() - started:.1f}s. Next:")
    print("\n".join(f"  {line}" for line in next_steps(cluster, args.node == "real")))
    return 0


def next_steps(cluster: Cluster, real: bool) -> list[str]:
    """What a user types next (docs/install.md): kubectl and helm on the PATH, this
    cluster's kubeconfig; on a real node, the operator from this checkout's chart."""
    path = [str(bin_dir())]
    helm = ROOT / ".venv" / "bin" / "helm"  # `make cluster` installs it there
    if helm.exists():
        path.append(str(helm.parent))
    steps = [f"export KUBECONFIG={cluster.kubeconfig} PATH={':'.join(path)}:$PATH"]
    if real:
        steps.append(f"helm install throttledjob {_here(ROOT / 'charts/throttledjob')} "
                     f"-n throttledjob-system --create-namespace "
                     f"-f {_here(ROOT / 'examples/one-machine/values.yaml')}")
    return steps


def _here(path: Path) -> str:
    """`path` as typed from the current directory (relative when under it)."""
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    return str(path)


if __name__ == "__main__":
    sys.exit(main())
