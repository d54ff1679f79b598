"""The cluster's DNS for a real node (tools/k8s/node.py): CoreDNS, built from its Go module
by tools/k8s/build.sh, run as a process of the cluster on this machine and listening on
the node's bridge gateway, the address every pod of the node reaches. The kubelet's
clusterDNS names that address, so pods resolve Services (`<svc>.<ns>.svc.cluster.local`),
headless Services' pods and `<hostname>.<subdomain>.<ns>.svc.cluster.local` as in any
cluster; other names go to this machine's resolvers. Stdlib only.
"""

from __future__ import annotations

import urllib.request
from typing import Any

from tools.k8s.host import free_port

DOMAIN = "cluster.local"
# The kubernetes plugin answers for the cluster's domain and reverse lookups of its pods
# and Services (as kubeadm's Corefile does, without `loop`: the forward target is the
# machine's resolver, never this server).
COREFILE = """.:53 {{
    bind {ip}
    errors
    ready 127.0.0.1:{ready_port}
    kubernetes {domain} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    forward . /etc/resolv.conf
    cache 5
}}
"""


def start(cluster: Any, ip: str, timeout: float = 60.0) -> None:
    """CoreDNS on `ip`:53 (UDP and TCP) for `cluster` (a cluster.Cluster), reading the
    API server as the cluster's admin; returns once it has synced with it. The cluster's
    `down` (or node.teardown) stops it."""
    ready_port = free_port()
    corefile = cluster.dir / "Corefile"
    corefile.write_text(COREFILE.format(ip=ip, ready_port=ready_port, domain=DOMAIN,
                                        kubeconfig=cluster.kubeconfig))
    cluster.start_process("coredns", ["-conf", str(corefile)])
    cluster.wait(lambda: _ready(ready_port), timeout, "CoreDNS ready")


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False
