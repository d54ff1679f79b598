"""The cluster's DNS (CoreDNS, tools/k8s/dns.py) as pods of the real node see it: from
inside a pod of the product image, a Service's name gives its ClusterIP, a headless
Service's name its pods' IPs, a name that exists nowhere no answer; the pods of an
Indexed Job with a `subdomain` and a headless Service of that name find each other as
`<job>-<index>.<service>` and talk, and so do the pods of a two-replica JobSet (with real
JobSet, tools/k8s/batch.py) as `<jobset>-worker-<index>-0.<jobset>`.

Needs what the real node needs (tests/cluster/test_node_live.py says what).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from testing.cluster_cli import Kubectl, job_finished, wait_json
from testing.helpers import wait_for
from tools.k8s import images
from tools.k8s import node as node_mod

pytestmark = pytest.mark.timeout(1200)
POD_TIMEOUT = 120.0
RESTRICTED = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
# Prints the IPv4 addresses a name resolves to inside the pod (glibc, the pod's
# resolv.conf: the cluster's DNS and its search path), as JSON; [] when it has none.
RESOLVE = """
import json, socket, sys
try:
    found = socket.getaddrinfo(sys.argv[1], 80, socket.AF_INET, socket.SOCK_STREAM)
except socket.gaierror:
    found = []
print(json.dumps(sorted({a[4][0] for a in found})))
"""


def container(command: list[str], **extra: Any) -> dict[str, Any]:
    return {"name": "main", "image": images.PRODUCT_IMAGE, "imagePullPolicy": "Never",
            "command": command, "securityContext": CONTAINER_SECURITY, **extra}


def resolve(kubectl: Kubectl, namespace: str, pod: str, name: str) -> list[str]:
    out = kubectl("exec", "-n", namespace, pod, "--", "python", "-c", RESOLVE, name).stdout
    return json.loads(out)


def test_services_resolve_inside_a_pod(real_node: Any, kubectl: Kubectl,
                                       namespace: str) -> None:
    web = f"web-{uuid.uuid4().hex[:4]}"
    kubectl.apply(
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": web, "namespace": namespace, "labels": {"app": web}},
         "spec": {"restartPolicy": "Never", "securityContext": RESTRICTED,
                  "activeDeadlineSeconds": 600,
                  "containers": [container(["python", "-c", "import time; time.sleep(600)"])]}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": web, "namespace": namespace},
         "spec": {"clusterIP": "None", "selector": {"app": web},
                  "ports": [{"port": 80}]}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": f"{web}-ip", "namespace": namespace},
         "spec": {"selector": {"app": web}, "ports": [{"port": 80}]}})
    pod = wait_json(kubectl, lambda p: p["status"].get("phase") == "Running", "pod", "-n",
                    namespace, web, what=f"pod {web} Running", timeout=POD_TIMEOUT)
    assert pod["spec"]["nodeName"] == node_mod.NODE_NAME
    pod_ip = pod["status"]["podIP"]
    cluster_ip = kubectl.json("get", "service", "-n", namespace, f"{web}-ip")["spec"][
        "clusterIP"]

    # The headless Service's name is its ready pods' IPs, once the EndpointSlice says so.
    fqdn = f"{web}.{namespace}.svc.cluster.local"
    wait_for(lambda: resolve(kubectl, namespace, web, fqdn) == [pod_ip], POD_TIMEOUT,
             interval=0.5, what=f"{fqdn} to resolve to {pod_ip}")
    assert resolve(kubectl, namespace, web, web) == [pod_ip]  # the pod's search path
    assert resolve(kubectl, namespace, web, f"{web}-ip.{namespace}.svc.cluster.local") == [
        cluster_ip]
    assert resolve(kubectl, namespace, web, "kubernetes.default.svc.cluster.local") == [
        real_node.cluster.service_ip]
    assert resolve(kubectl, namespace, web, f"nothing.{namespace}.svc.cluster.local") == []
    resolv = kubectl("exec", "-n", namespace, web, "--", "cat", "/etc/resolv.conf").stdout
    gateway = real_node.cluster.state["node"]["gateway"]
    assert f"nameserver {gateway}" in resolv.splitlines(), resolv
    assert f"search {namespace}.svc.cluster.local svc.cluster.local cluster.local" in resolv


# Each of two pods (index INDEX, 0 or 1) listens, resolves its peer by hostname.subdomain
# (PEER_FORMAT with the other's index), sends it its index, and ends once it has both
# reached its peer and heard from it. Each line in one write: the two threads' print()s,
# written in parts, once interleaved into "reachedheard 1".
PEER = """
import os, socket, sys, threading, time
index = int(os.environ["INDEX"])
peer = os.environ["PEER_FORMAT"].format(other=1 - index)
deadline = time.monotonic() + 100
heard = threading.Event()
server = socket.create_server(("", 7000))

def listen():
    conn, _ = server.accept()
    with conn:
        os.write(1, f"heard {conn.recv(16).decode()}\\n".encode())
    heard.set()

threading.Thread(target=listen, daemon=True).start()
while True:
    try:
        ip = socket.getaddrinfo(peer, 7000, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
        with socket.create_connection((ip, 7000), timeout=2) as c:
            c.sendall(str(index).encode())
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(f"never reached {peer}")
        time.sleep(0.2)
os.write(1, f"reached {peer} {ip}\\n".encode())
if not heard.wait(max(0.0, deadline - time.monotonic())):
    sys.exit("never heard from the peer")
"""


def test_the_pods_of_an_indexed_job_find_each_other_by_name(real_node: Any, kubectl: Kubectl,
                                                            namespace: str) -> None:
    job = f"peers-{uuid.uuid4().hex[:4]}"
    service = f"{job}-svc"
    env = [{"name": "INDEX", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations["
                                                       "'batch.kubernetes.io/job-completion-index']"}}},
           {"name": "PEER_FORMAT", "value": f"{job}-{{other}}.{service}"}]
    kubectl.apply(
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": service, "namespace": namespace},
         # A pod's name is published while it starts, before it is ready (as JobSet does).
         "spec": {"clusterIP": "None", "selector": {"job-name": job},
                  "publishNotReadyAddresses": True, "ports": [{"port": 7000}]}},
        {"apiVersion": "batch/v1", "kind": "Job",
         "metadata": {"name": job, "namespace": namespace},
         "spec": {"completions": 2, "parallelism": 2, "completionMode": "Indexed",
                  "backoffLimit": 0, "activeDeadlineSeconds": 300,
                  "template": {"spec": {
                      "subdomain": service, "restartPolicy": "Never",
                      "securityContext": RESTRICTED,
                      "containers": [container(["python", "-c", PEER], env=env)]}}}})
    done = job_finished(kubectl, namespace, job, timeout=POD_TIMEOUT * 2)
    pods = kubectl.json("get", "pods", "-n", namespace, "-l", f"job-name={job}")["items"]
    logs = {p["metadata"]["name"]: kubectl("logs", "-n", namespace, p["metadata"]["name"],
                                           check=False).stdout for p in pods}
    assert done["status"].get("succeeded") == 2, (done["status"], logs)
    by_index = {int(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]):
                p for p in pods}
    found_each_other(by_index, logs, lambda i: f"{job}-{i}", lambda i: f"{job}-{i}.{service}")


def found_each_other(by_index: dict[int, Any], logs: dict[str, str],
                     hostname: Any, name: Any) -> None:
    """Pods 0 and 1 ran on the real node as `hostname(i)`, each reached the other at
    `name(other)` (its pod IP) and heard from it (PEER's lines)."""
    assert sorted(by_index) == [0, 1]
    for index, pod in by_index.items():
        peer = by_index[1 - index]
        assert pod["spec"]["nodeName"] == node_mod.NODE_NAME
        assert pod["spec"]["hostname"] == hostname(index)
        said = logs[pod["metadata"]["name"]].splitlines()
        assert f"reached {name(1 - index)} {peer['status']['podIP']}" in said, said
        assert f"heard {1 - index}" in said, said


def test_the_pods_of_a_jobset_find_each_other_by_name(
        real_node: Any, batch_components: Any, kubectl: Kubectl, namespace: str) -> None:
    """Two replicated Jobs of a JobSet (the object a distributed training job is made
    of): JobSet's headless Service and hostnames, the cluster's DNS, on the real node."""
    js = f"pair-{uuid.uuid4().hex[:4]}"
    env = [{"name": "INDEX", "valueFrom": {"fieldRef": {
               "fieldPath": "metadata.labels['jobset.sigs.k8s.io/job-index']"}}},
           {"name": "PEER_FORMAT", "value": f"{js}-worker-{{other}}-0.{js}"}]
    kubectl.apply({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": js, "namespace": namespace},
        "spec": {"network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
                 "replicatedJobs": [{"name": "worker", "replicas": 2, "template": {"spec": {
                     "parallelism": 1, "completions": 1, "backoffLimit": 0,
                     "activeDeadlineSeconds": 300,
                     "template": {"spec": {
                         "restartPolicy": "Never", "securityContext": RESTRICTED,
                         "containers": [container(["python", "-c", PEER], env=env)]}}}}}]}})
    done = wait_json(kubectl, lambda j: any(
        c["type"] in ("Completed", "Failed") and c["status"] == "True"
        for c in (j.get("status") or {}).get("conditions") or []),
        "jobsets.jobset.x-k8s.io", "-n", namespace, js, what=f"JobSet {js} to finish",
        timeout=POD_TIMEOUT * 2)
    pods = kubectl.json("get", "pods", "-n", namespace, "-l",
                        f"jobset.sigs.k8s.io/jobset-name={js}")["items"]
    logs = {p["metadata"]["name"]: kubectl("logs", "-n", namespace, p["metadata"]["name"],
                                           check=False).stdout for p in pods}
    completed = [c for c in done["status"]["conditions"] if c["status"] == "True"]
    assert [c["type"] for c in completed] == ["Completed"], (completed, logs)
    by_index = {int(p["metadata"]["labels"]["jobset.sigs.k8s.io/job-index"]): p for p in pods}
    found_each_other(by_index, logs, lambda i: f"{js}-worker-{i}-0",
                     lambda i: f"{js}-worker-{i}-0.{js}")
