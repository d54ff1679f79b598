"""A real node for the test cluster: the kubelet (built with the control plane by
tools/k8s/build.sh) on containerd, runc and the CNI plugins from Debian, running real pods
on this machine. Added by `python -m tools.k8s.cluster up --node real` (or
`Cluster.add_real_node`); `Cluster.down` calls teardown(). Its images come from
tools/k8s/images.py.

A node is given its cluster (a cluster.Cluster) and runs its processes through it
(`start_process`, `wait`, `update_state`), so the cluster's `down` stops them; this module
never imports cluster.py.

Everything the node makes lives in the cluster's directory (containerd root and state,
network namespaces, kubelet root, pod logs, CNI IPAM) or is recorded there (the bridge,
the cgroup root, kernel settings the kubelet and the bridge plugin change), so that
teardown() can undo it. Stdlib only.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
from pathlib import Path
from typing import Any

from tools.k8s import dns
from tools.k8s.host import cgroup_mounts, free_port, listening, run
from tools.k8s.images import PAUSE_IMAGE, pause_archive, product_archive

HERE = Path(__file__).resolve().parent
NODE_NAME = "real-node-0"
# The fake GPUs' device plugin, as the cluster's process list names it.
FAKE_GPUS = "fake-gpus"
GPU_NODE_LABEL = "nvidia.com/gpu.present"
# Pods with no node selector land here (KWOK's node is tainted, cluster.KWOK_TAINT); a
# test may still name this node by its label.
LABELS = {"throttledjob.io/node": "real"}
# Debian packages the node needs, one a line: `make tools` installs the same list.
APT_PACKAGES = tuple((HERE / "node-packages.txt").read_text().split())
NEEDED = {"containerd": "/usr/bin/containerd", "ctr": "/usr/bin/ctr", "runc": "/usr/sbin/runc",
          "bridge": "/usr/lib/cni/bridge", "host-local": "/usr/lib/cni/host-local",
          "loopback": "/usr/lib/cni/loopback", "podman": "/usr/bin/podman",
          "debootstrap": "/usr/sbin/debootstrap", "go": None, "ip": "/usr/sbin/ip"}
CNI_BIN = "/usr/lib/cni"
# The kubelet sets these when they differ from what it wants (it has no "leave them"
# setting; protectKernelDefaults only turns the change into a refusal to start), and the
# bridge plugin turns on forwarding for its gateway. Saved before, restored at teardown.
SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
           "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes", "net/ipv4/ip_forward")
CONTAINER_LOGS = Path("/var/log/containers")  # hard-coded in the kubelet: symlinks only
# Hard-coded in containerd 1.6: each shim's socket is /run/containerd/s/<sha256 of
# "<containerd socket>/<namespace>/<id>">, removed by the shim unless it is killed.
SHIM_SOCKETS = Path("/run/containerd/s")


class NodeUnavailable(RuntimeError):
    """The machine lacks what a real node needs (a tool, root)."""


def missing_tools() -> list[str]:
    missing = [name for name, path in NEEDED.items()
               if not (shutil.which(name) if path is None else os.access(path, os.X_OK))]
    if os.geteuid() != 0:
        missing.append("root")
    return missing


def check() -> None:
    missing = missing_tools()
    if missing:
        raise NodeUnavailable(f"a real node needs {', '.join(missing)}: apt-get install "
                              f"{' '.join(APT_PACKAGES)} (as root)")


# --- the node ----------------------------------------------------------------------------

CONTAINERD_CONFIG = """version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
# Plugins this node does not use; they only log errors here.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{d}/containerd/containerd.sock"

[ttrpc]
  address = "{d}/containerd/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  # Built locally (no registry is reachable): tools/k8s/pause.
  sandbox_image = "{pause}"
  # Pods' network namespaces under the state directory, not /var/run/netns.
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  # Root here lacks CAP_SYS_RESOURCE, so no process may lower its oom_score_adj; runc
  # fails ("can't get final child's PID from pipe: EOF") applying the kubelet's -998 for
  # sandboxes. This clamps every container's score at containerd's own (0) or above.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # No systemd on this machine: cgroupfs, as the kubelet's cgroupDriver.
        SystemdCgroup = false
        # runc's state here, not in /run/containerd/runc.
        Root = "{d}/containerd/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{d}/cni/net.d"
    max_conf_num = 1
"""


class RealNode:
    """A kubelet and a containerd for `cluster` (a cluster.Cluster), in cluster.dir/node."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.dir = cluster.dir / "node"
        self.sock = self.dir / "containerd" / "containerd.sock"

    def _ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run("ctr", "--address", str(self.sock), "--namespace", "k8s.io", *args,
                    check=check, timeout=300)

    def up(self, timeout: float = 180.0) -> None:
        check()
        state = self.cluster.state
        if state.get("node") and "kubelet" in state["pids"] and self.ready():
            return
        token = state.get("node_token")
        if not token:
            raise NodeUnavailable("this cluster was started without a node token: "
                                  "`python -m tools.k8s.cluster down` it and start it "
                                  "again")
        if not (self.cluster.dir / "certs" / "ca.key").exists():
            raise NodeUnavailable("this cluster was started without a CA: `python -m "
                                  "tools.k8s.cluster down` it and start it again")
        archives = (pause_archive(), product_archive())
        d = self.dir
        for sub in ("containerd", "cni/net.d", "cni/ipam", "kubelet", "pod-logs", "certs"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        suffix = secrets.token_hex(3)
        subnet = ipaddress.ip_network(
            f"10.{200 + secrets.randbelow(50)}.{secrets.randbelow(256)}.0/24")
        # Inside the cluster's own cgroup (cluster.CPU_SHARES), beside its daemons.
        node = {"bridge": f"tj{suffix}",
                # Set, not the kernel's pick (below); local, unicast.
                "bridge_mac": "02:" + ":".join(f"{b:02x}" for b in secrets.token_bytes(5)),
                "cgroup_root": f"{state.get('cgroup', '')}/tj-node-{suffix}",
                "subnet": str(subnet),
                # The bridge's own address: the pods' gateway, the node's IP (where the API
                # server calls the kubelet) and the cluster's DNS server.
                "gateway": str(subnet[1]),
                "sysctls": {k: Path("/proc/sys", k).read_text().strip() for k in SYSCTLS},
                "logs_dir_existed": CONTAINER_LOGS.exists(),
                "shim_dir_existed": SHIM_SOCKETS.parent.exists()}
        # Recorded before anything is changed, so a failed start still cleans up.
        self.cluster.update_state(node=node)
        self._serve_kubernetes_service()
        gateway = node["gateway"]
        # The bridge exists before any pod, so the kubelet and CoreDNS can listen on its
        # address; the CNI bridge plugin takes it over as it is. Its MAC address is set,
        # not left to the kernel: an unset one follows the lowest of its ports', so a
        # pod's exit changed the gateway's MAC under every other pod, whose cached ARP
        # entry then sent new connections (the operator's to the API server) nowhere for
        # about 30 s.
        run("ip", "link", "add", node["bridge"], "address", node["bridge_mac"],
            "type", "bridge")
        run("ip", "address", "add", f"{gateway}/{subnet.prefixlen}", "dev", node["bridge"])
        run("ip", "link", "set", node["bridge"], "up")
        dns.start(self.cluster, gateway)

        (d / "containerd" / "config.toml").write_text(CONTAINERD_CONFIG.format(
            d=d, pause=PAUSE_IMAGE, cni_bin=CNI_BIN))
        (d / "cni/net.d/10-throttledjob.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "throttledjob", "plugins": [{
                "type": "bridge", "bridge": node["bridge"], "isGateway": True,
                "ipMasq": False, "hairpinMode": True,
                "ipam": {"type": "host-local", "dataDir": str(d / "cni/ipam"),
                         "ranges": [[{"subnet": node["subnet"], "gateway": gateway}]],
                         "routes": [{"dst": "0.0.0.0/0"}]}}]}, indent=1))
        self.cluster.start_process("containerd", ["--config", str(d / "containerd/config.toml"),
                                                  "--log-level", "warn"],
                                   program="/usr/bin/containerd")
        self.cluster.wait(lambda: self.sock.exists() and self._ctr(
            "version", check=False).returncode == 0, 60, "containerd")
        for archive in archives:
            self.load(archive)

        # The kubelet's cgroups go under a root of this node's own, in every hierarchy, so
        # two nodes never share /kubepods and teardown knows what to remove.
        for mount in cgroup_mounts():
            (mount / node["cgroup_root"].lstrip("/")).mkdir(parents=True, exist_ok=True)
        # RBAC only (no Node authorizer): the node's user gets the system:node role.
        with contextlib.suppress(urllib.error.HTTPError):
            self.cluster.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": f"throttledjob:node:{NODE_NAME}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "system:node"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                              "name": f"system:node:{NODE_NAME}"}]})
        kubeconfig = self.cluster.kubeconfig_for(token, d / "kubelet.kubeconfig",
                                                 f"system:node:{NODE_NAME}")
        certs = self.cluster.dir / "certs"
        serving = self.cluster.issue_cert("kubelet", f"/CN={NODE_NAME}", "serverAuth",
                                          ips=(gateway,), dns=(NODE_NAME,))
        (d / "kubelet-config.json").write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            # This machine mounts cgroup v1 controllers (the unified hierarchy beside them
            # has none): kubelet 1.35+ refuses v1 unless told otherwise.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs", "cgroupRoot": node["cgroup_root"],
            "containerRuntimeEndpoint": f"unix://{self.sock}",
            "podLogsDir": str(d / "pod-logs"),
            # Else the kubelet creates /usr/libexec/kubernetes/kubelet-plugins/volume/exec.
            "volumePluginDir": str(d / "volume-plugins"),
            # On the node's IP (the bridge's gateway, an address of this machine only),
            # with a certificate of the cluster's CA. Who calls it is the API server's
            # to say: its client certificate (kubectl logs, exec) checked against the CA,
            # bearer tokens by TokenReview, every call by SubjectAccessReview.
            "address": gateway, "port": free_port(), "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": 0,
            "tlsCertFile": str(serving), "tlsPrivateKeyFile": str(certs / "kubelet.key"),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(certs / "ca.crt")}},
            "authorization": {"mode": "Webhook"},
            "clusterDNS": [gateway], "clusterDomain": dns.DOMAIN,
            # No iptables rules on the machine (kube-proxy is not run either).
            "makeIPTablesUtilChains": False,
            # The images were loaded by hand and cannot be pulled again: never collect them.
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            # The node's disk is the machine's, shared with builds and caches: a full
            # one is the machine's problem, and eviction of the tests' pods (DiskPressure
            # taints the node, every pod then waits Pending) would only hide it.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "0%",
                             "imagefs.available": "0%", "nodefs.inodesFree": "0%"},
            "failSwapOn": False, "maxPods": 20,
            "resolvConf": "/etc/resolv.conf", "staticPodPath": "",
            "serializeImagePulls": False, "registerNode": True,
            # A container that dies is restarted within 2 s, not after up to 5 minutes of
            # crash-loop backoff (beta, on by default since 1.35): the guard's test kills
            # the sidecar five times in a row. Nothing the product does depends on it.
            "crashLoopBackOff": {"maxContainerRestartPeriod": "2s"},
        }, indent=1))
        self.cluster.start_process("kubelet", [
            "--config", str(d / "kubelet-config.json"), "--kubeconfig", str(kubeconfig),
            "--root-dir", str(d / "kubelet"), "--cert-dir", str(d / "certs"),
            "--hostname-override", NODE_NAME, "--node-ip", gateway, "--v", "1",
            "--node-labels", ",".join(f"{k}={v}" for k, v in LABELS.items())])
        self.cluster.wait(self.ready, timeout, f"node {NODE_NAME} Ready")

    def _serve_kubernetes_service(self) -> None:
        """Pods reach the API server as in any cluster, at the `kubernetes` Service's
        ClusterIP: an address of this machine (on lo: this kernel has no dummy
        interfaces) where tools/k8s/service_proxy.py forwards to the API server."""
        ip = self.cluster.service_ip
        if run("ip", "address", "add", f"{ip}/32", "dev", "lo", check=False).returncode:
            raise NodeUnavailable(
                f"{ip} is on lo already: another real node runs on this machine (`python -m "
                f"tools.k8s.cluster down` it), or a killed one left it "
                f"(`ip address del {ip}/32 dev lo`)")
        self.cluster.update_state(node={**self.cluster.state["node"], "service_ip": ip})
        self.cluster.start_process("service-proxy", [
            str(HERE / "service_proxy.py"), ip, "443", "127.0.0.1",
            str(self.cluster.state["ports"]["apiserver"])], program=sys.executable)
        self.cluster.wait(lambda: listening(ip, 443), 30, "the kubernetes Service proxy")

    def down(self) -> None:
        """Tear this node down and forget it; the control plane (and KWOK) keep running."""
        teardown(self.cluster)
        with contextlib.suppress(urllib.error.HTTPError):
            self.cluster.request("DELETE", f"/api/v1/nodes/{NODE_NAME}")
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def pod_resources_socket(self) -> Path:
        """The kubelet's PodResources API (what the GPU node agent reads)."""
        return self.dir / "kubelet" / "pod-resources" / "kubelet.sock"

    def start_fake_gpus(self, count: int = 2, timeout: float = 60.0,
                        replicas: int = 1) -> None:
        """`count` fake nvidia.com/gpu on this node, from a device plugin
        (tools/k8s/fake_gpus.py, the project's venv: it speaks gRPC), each shared
        `replicas` ways; `down` stops it. Nothing to do where it runs already."""
        if FAKE_GPUS in self.cluster.state["pids"]:
            return
        root = HERE.parent.parent
        python = root / ".venv" / "bin" / "python"
        self.cluster.start_process(
            FAKE_GPUS, ["-m", "tools.k8s.fake_gpus", "--count", str(count),
                        "--replicas", str(replicas)],
            program=str(python if python.exists() else sys.executable),
            env={**os.environ, "PYTHONPATH": str(root)})
        devices = count * replicas
        self.cluster.wait(lambda: self.allocatable("nvidia.com/gpu") == str(devices), timeout,
                          f"{devices} fake GPU devices allocatable on {NODE_NAME}")
        # As NVIDIA's GPU feature discovery labels a GPU node (the chart's node agent
        # selects nodes by it).
        self.cluster.request("PATCH", f"/api/v1/nodes/{NODE_NAME}",
                             {"metadata": {"labels": {GPU_NODE_LABEL: "true"}}},
                             content_type="application/merge-patch+json")

    def stop_fake_gpus(self) -> None:
        self.cluster.stop_process(FAKE_GPUS)

    def restart_fake_gpus(self, count: int, replicas: int = 1) -> None:
        """The plugin again with other devices (no pod may hold one of the old). The node's
        allocatable count lags a plugin's stop by a status update: wait for a count the
        old devices did not have, or the old one is read as the new plugin's."""
        before = self.allocatable("nvidia.com/gpu")
        assert before != str(count * replicas), f"{before} devices already: no change to see"
        self.stop_fake_gpus()
        self.start_fake_gpus(count, replicas=replicas)

    def allocatable(self, resource: str) -> str | None:
        node = self.cluster.request("GET", f"/api/v1/nodes/{NODE_NAME}")
        return ((node.get("status") or {}).get("allocatable") or {}).get(resource)

    def load(self, archive: Path) -> None:
        """An image archive into this node's containerd (the kubelet never pulls here)."""
        self._ctr("images", "import", "--snapshotter", "overlayfs", str(archive))

    def pod_log(self, namespace: str, name: str, uid: str, container: str) -> str:
        """What a container wrote, from the kubelet's log file (CRI format: time, stream,
        tag, text): also the output of a container that was restarted since, where
        `kubectl logs` has only the current one and the one before."""
        lines = []
        for f in sorted((self.dir / "pod-logs" / f"{namespace}_{name}_{uid}" / container)
                        .glob("*.log")):
            lines += [line.split(" ", 3)[3] for line in f.read_text().splitlines()
                      if line.count(" ") >= 3]
        return "\n".join(lines)

    def container_cgroup(self, container_id: str, controller: str) -> Path | None:
        """The cgroup directory of one of this node's containers ("containerd://ID" as in
        a pod's status, or ID) in the v1 hierarchy of `controller` (cpuacct, memory);
        None when there is none (not started yet, or gone)."""
        cid = container_id.rpartition("://")[2]
        root = self.cluster.state["node"]["cgroup_root"].lstrip("/")
        for mount in cgroup_mounts():
            if controller in mount.name.split(","):
                return next((mount / root).rglob(cid), None)
        return None

    def ready(self) -> bool:
        try:
            node = self.cluster.request("GET", f"/api/v1/nodes/{NODE_NAME}")
        except urllib.error.HTTPError:
            return False
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for c in (node.get("status") or {}).get("conditions") or [])


def teardown(cluster: Any) -> None:
    """Undo everything up() made, also after a failed or half-done start: pods'
    processes, mounts, network namespaces, the bridge, cgroups, kernel settings. The
    cluster's processes other than these two, and its directory, go with cluster.down."""
    state = cluster.state
    node, pids, d = state.get("node") or {}, state.get("pids", {}), cluster.dir / "node"
    cluster.stop_process("kubelet")
    cluster.stop_process("coredns")
    cluster.stop_process("service-proxy")
    if node.get("service_ip"):
        run("ip", "address", "del", f"{node['service_ip']}/32", "dev", "lo", check=False)
    sock = d / "containerd" / "containerd.sock"
    # Every task's id (its bundle; runc's state), for the shim sockets below.
    task_ids = {p.name for top in (d / "containerd/state/io.containerd.runtime.v2.task/k8s.io",
                                   d / "containerd/runc/k8s.io") if top.is_dir()
                for p in top.iterdir()}
    if "containerd" in pids and sock.exists():
        ctr = ("ctr", "--address", str(sock), "--namespace", "k8s.io")
        listed = run(*ctr, "containers", "ls", "-q", check=False, timeout=60)
        for cid in listed.stdout.split():
            # Kills the task, the shim unmounts its rootfs and exits; then the record.
            run(*ctr, "tasks", "delete", "--force", cid, check=False, timeout=60)
            run(*ctr, "containers", "delete", cid, check=False, timeout=60)
    cluster.stop_process("containerd")
    # Anything still running from this node: shims (they outlive containerd; their command
    # line names our socket) and processes left in the node's cgroups.
    leftovers = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                if os.path.basename(argv[0]).startswith(b"containerd-shim") and \
                        str(sock).encode() in argv:
                    leftovers.add(int(proc.name))
    cgroup_root = node.get("cgroup_root")
    cgroup_dirs = [m / cgroup_root.lstrip("/") for m in cgroup_mounts()] if cgroup_root else []
    for top in cgroup_dirs:
        for procs in top.rglob("cgroup.procs") if top.exists() else ():
            with contextlib.suppress(OSError):
                leftovers.update(int(p) for p in procs.read_text().split())
    # SIGKILL: a container's PID 1 ignores SIGTERM from outside unless it handles it.
    for pid in leftovers - {os.getpid()}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in leftovers) and time.monotonic() < deadline:
        time.sleep(0.1)
    for tid in task_ids:
        name = hashlib.sha256(f"{sock}/k8s.io/{tid}".encode()).hexdigest()
        with contextlib.suppress(OSError):
            (SHIM_SOCKETS / name).unlink()
    if not node.get("shim_dir_existed", True):
        for empty in (SHIM_SOCKETS, SHIM_SOCKETS.parent):
            with contextlib.suppress(OSError):
                empty.rmdir()
    # Mounts under the node's directory (network namespaces, overlay rootfs, pod volumes),
    # deepest first.
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == str(d) or point.startswith(f"{d}/"):
            mounts.append(point)
    for point in sorted(mounts, key=len, reverse=True):
        if run("umount", point, check=False).returncode != 0:
            run("umount", "-l", point, check=False)
    for top in cgroup_dirs:
        if top.exists():
            for sub, _, _ in sorted(os.walk(top), key=lambda w: -len(w[0])):
                with contextlib.suppress(OSError):
                    os.rmdir(sub)
    if node.get("bridge"):
        run("ip", "link", "delete", node["bridge"], check=False)
    for key, value in (node.get("sysctls") or {}).items():
        path = Path("/proc/sys", key)
        with contextlib.suppress(OSError):
            if path.read_text().strip() != value:
                path.write_text(value)
    if CONTAINER_LOGS.is_dir():
        for link in CONTAINER_LOGS.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and str(d) in os.readlink(link):
                    link.unlink()
        if not node.get("logs_dir_existed", True):
            with contextlib.suppress(OSError):
                CONTAINER_LOGS.rmdir()
    cluster.update_state(node=None)
