"""The operator at scale on a real API server, beside the real Job controller.

A burst of N ThrottledJobs (default 1,000), then a steady stream at 10 per second:
time until every Job exists, create->Job latency (p50/p99), the operator's RSS and CPU,
and, as the yardsticks in the same run, the Job controller's own Job->Pod latency for
the same Jobs and the floor: a plain client, no operator running, creating for as many
names the ThrottledJob, the ConfigMap and the Job the operator would make (the least API
work a ThrottledJob needs). The operator's writes per ThrottledJob in the burst come from
the API server's audit log, split into its own calls and kopf's. Every time is taken by
one client on one clock: the moment it sent the create, and the moment its watch saw the
Job or the Pod.

    .venv/bin/python -m bench.operator_load [--n 1000] [--rate 10] [--steady-seconds 30]

Uses the cluster `make cluster` left running, else starts its own (tools/k8s/).
The operator runs as the chart's ServiceAccount with the chart's RBAC.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from bench.harness import a_cluster, machine_cpu_seconds, markdown
from bench.sidecars import SLOWDOWN_AFTER
from testing.audit import ours_and_kopfs, writes
from testing.paths import ROOT, VENV_BIN
from throttledjob.operator.children import METRICS_PORT, build_child, build_configmap
from throttledjob.operator.config import OperatorSettings
from throttledjob.operator.validation import validate
from tools.k8s import cluster as k8s

OPERATOR_NS = "throttledjob-system"
CPUS = os.cpu_count() or 1


class Watch(threading.Thread):
    """First time this client saw each object of a kind in a namespace as `key` names it
    (None: not yet; an object made before the watch is seen at its next change)."""

    def __init__(self, cluster: Any, path: str, key: Any) -> None:
        super().__init__(daemon=True)
        self.cluster, self.path, self.key = cluster, path, key
        self.seen: dict[str, float] = {}
        self.ready = threading.Event()
        self._done = threading.Event()
        self._sock: socket.socket | None = None

    def stop(self) -> None:
        """End the watch now: a later API server restart (the suite's next test) must not
        find this thread still reading. The socket is shut down under the reader, whose
        blocked read then returns: closing the response instead waits for the reader's
        lock, held until the next event (a bookmark comes about once a minute)."""
        self._done.set()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)

    def run(self) -> None:
        try:
            self._watch()
        except Exception:
            # stop() shuts the socket under the reader (which then fails in any of a few
            # ways); a watch that broke mid-benchmark is an error.
            if not self._done.is_set():
                raise

    def _watch(self) -> None:
        server = urllib.parse.urlsplit(self.cluster.server)
        rv = self.cluster.request("GET", self.path)["metadata"]["resourceVersion"]
        while not self._done.is_set():
            conn = http.client.HTTPSConnection(server.hostname, server.port, timeout=600,
                                               context=self.cluster.ssl_context())
            conn.request("GET", f"{self.path}?watch=1&resourceVersion={rv}"
                         "&allowWatchBookmarks=true",
                         headers={"Authorization": f"Bearer {self.cluster.admin_token}"})
            with contextlib.closing(conn), conn.getresponse() as resp:
                self._sock = conn.sock
                self.ready.set()
                for line in resp:
                    now = time.monotonic()
                    event = json.loads(line)
                    obj = event["object"]
                    rv = obj["metadata"].get("resourceVersion", rv)
                    name = self.key(obj) if event["type"] in ("ADDED", "MODIFIED") else None
                    if name and name not in self.seen:
                        self.seen[name] = now


class Sidecars:
    """The sidecar answer of every KWOK pod (bench/sidecars.py), in its own process."""

    def __init__(self, host: str, tmp: Path) -> None:
        self.hits_file = tmp / "sidecar-hits"
        self.proc = subprocess.Popen(
            [str(VENV_BIN / "python"), "-m", "bench.sidecars", host, str(METRICS_PORT),
             str(self.hits_file)], cwd=ROOT)

    @property
    def hits(self) -> int:
        """Reads answered, as of the last second."""
        with contextlib.suppress(OSError, ValueError):
            return int(self.hits_file.read_text())
        return 0

    def step(self) -> None:
        self.proc.send_signal(signal.SIGUSR1)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def stepped(obj: dict[str, Any]) -> str | None:
    """A ThrottledJob's name once its status shows the sidecars' step."""
    observed = (obj.get("status") or {}).get("observed") or {}
    return obj["metadata"]["name"] if observed.get("slowdown") == SLOWDOWN_AFTER else None


def why_not_stepped(cluster: Any, tj_path: str, seen: dict[str, float]) -> dict[str, int]:
    """The ThrottledJobs whose status never showed the step, counted by their phase and
    the first error their status gives."""
    counts: dict[str, int] = {}
    for item in cluster.request("GET", tj_path)["items"]:
        if item["metadata"]["name"] in seen:
            continue
        st = item.get("status") or {}
        errors = (st.get("observed") or {}).get("errors") or ["-"]
        key = f"{st.get('phase')}: {errors[0][:120]}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def percentile(values: list[float], q: float) -> float | None:
    """None where nothing was measured (the table says so, rather than the run failing)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else None


def rounded(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def proc_status_mib(pid: int, key: str) -> float:
    """A memory figure of /proc/PID/status (VmHWM: the peak, VmRSS: now), MiB."""
    status = dict(line.split(":", 1) for line in
                  Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(status[key].split()[0]) / 1024


def proc_figures(pid: int) -> tuple[float, float]:
    """(peak RSS MiB, CPU seconds) of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return proc_status_mib(pid, "VmHWM"), (int(fields[11]) + int(fields[12])) / ticks


def settle(pid: int, quiet_cores: float = 0.25, at_most: float = 60.0) -> float:
    """Wait until a process uses under `quiet_cores` over 2 s (the burst's Job and pod
    events handled), for at most `at_most` seconds; returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < at_most:
        before = proc_figures(pid)[1]
        time.sleep(2)
        if (proc_figures(pid)[1] - before) / 2 < quiet_cores:
            break
    return time.monotonic() - started


def tj(name: str, namespace: str) -> dict[str, Any]:
    container = {"name": "work", "image": "localhost/work:dev", "command": ["python", "w.py"],
                 "securityContext": {"allowPrivilegeEscalation": False,
                                     "capabilities": {"drop": ["ALL"]}}}
    return {"apiVersion": "throttledjob.io/v1alpha1", "kind": "ThrottledJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"jobTemplate": {"spec": {"backoffLimit": 0, "template": {
                "metadata": {"annotations": {"throttledjob.io/test-run-for": "1h"}},
                "spec": {**k8s.ON_KWOK, "restartPolicy": "Never", "containers": [container],
                         "securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                                             "seccompProfile": {"type": "RuntimeDefault"}}}}}},
                "throttle": {"targets": {"cpu": {"peak": "1"}}}}}


def operator_kubeconfig(cluster: Any, kubectl: list[str], tmp: Path) -> tuple[Path, str]:
    """A kubeconfig of the chart's ServiceAccount (the chart's RBAC applied), and its
    user name as the audit log has it."""
    rendered = subprocess.run([str(VENV_BIN / "helm"), "template", "tj",
                               str(ROOT / "charts/throttledjob"), "-n", OPERATOR_NS],
                              check=True, capture_output=True, text=True).stdout
    rbac = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in (
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
    subprocess.run([*kubectl, "create", "namespace", OPERATOR_NS], capture_output=True)
    subprocess.run([*kubectl, "apply", "-f", "-"], input=yaml.safe_dump_all(rbac), text=True,
                   check=True, capture_output=True)
    sa = next(d for d in rbac if d["kind"] == "ServiceAccount")["metadata"]["name"]
    token = cluster.service_account_token(OPERATOR_NS, sa)
    return (cluster.kubeconfig_for(token, tmp / "operator.kubeconfig"),
            f"system:serviceaccount:{OPERATOR_NS}:{sa}")


def floor(cluster: Any, kubectl: list[str], n: int) -> float:
    """The least API work n ThrottledJobs need, with no operator running: a plain client
    (8 threads, as for the burst) creates each ThrottledJob and then the ConfigMap and
    the Job the operator would make for it (its own builders, owned by the ThrottledJob).
    Returns the seconds until its watch saw every Job; the namespace is deleted, and
    gone, before it returns (the operator must not find these)."""
    namespace = f"floor-{uuid.uuid4().hex[:6]}"
    subprocess.run([*kubectl, "create", "namespace", namespace], check=True,
                   capture_output=True)
    jobs = Watch(cluster, f"/apis/batch/v1/namespaces/{namespace}/jobs",
                 lambda o: (o["metadata"].get("labels") or {}).get("throttledjob.io/name"))
    jobs.start()
    jobs.ready.wait(30)
    settings = OperatorSettings()
    tj_path = f"/apis/throttledjob.io/v1alpha1/namespaces/{namespace}/throttledjobs"

    def create(name: str) -> None:
        body = tj(name, namespace)
        made = cluster.request("POST", tj_path, body)
        owner = {"apiVersion": made["apiVersion"], "kind": made["kind"], "name": name,
                 "uid": made["metadata"]["uid"], "controller": True,
                 "blockOwnerDeletion": True}
        doc = validate(made)
        for path, child in ((f"/api/v1/namespaces/{namespace}/configmaps",
                             build_configmap(name, made["spec"], doc)),
                            (f"/apis/batch/v1/namespaces/{namespace}/jobs",
                             build_child(made, doc, settings))):
            child["metadata"]["ownerReferences"] = [owner]
            cluster.request("POST", path, child)

    names = [f"floor-{i:04d}" for i in range(n)]
    try:
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(create, names))
        deadline = time.monotonic() + 600
        while len([x for x in names if x in jobs.seen]) < n and time.monotonic() < deadline:
            time.sleep(0.1)
        return max(jobs.seen[x] for x in names if x in jobs.seen) - started
    finally:
        jobs.stop()
        subprocess.run([*kubectl, "delete", "namespace", namespace, "--timeout=600s"],
                       capture_output=True)


def run(cluster: Any, n: int, rate: float, steady_seconds: float,
        status_interval: float, settle_seconds: float = 30.0) -> dict[str, Any]:
    """The figures of one run; `settle_seconds`: how long after deleting them all the
    operator's memory is read (the suite's smoke run needs its table, not the figure)."""
    tmp = Path(tempfile.mkdtemp(prefix="tj-load-"))
    kubectl = [str(k8s.bin_dir() / "kubectl"), "--kubeconfig", str(cluster.kubeconfig)]
    subprocess.run([*kubectl, "apply", "--server-side", "-f",
                    str(ROOT / "charts/throttledjob/crds")], check=True, capture_output=True)
    floor_s = floor(cluster, kubectl, n)
    namespace = f"load-{uuid.uuid4().hex[:6]}"
    subprocess.run([*kubectl, "create", "namespace", namespace], check=True,
                   capture_output=True)
    kubeconfig, user = operator_kubeconfig(cluster, kubectl, tmp)
    audited = len(cluster.audit(user))
    env = {**os.environ, "KUBECONFIG": str(kubeconfig),
           "THROTTLEDJOB_RESYNC_INTERVAL": "3600", "KUBERNETES_SERVICE_HOST": "",
           "THROTTLEDJOB_STATUS_INTERVAL": str(status_interval),
           "PYTHONPATH": str(ROOT / "bench/as_in_the_image")}  # its memory as in a pod
    sidecars = Sidecars(cluster.pod_ip, tmp)
    log = open(tmp / "operator.log", "wb")  # noqa: SIM115
    op = subprocess.Popen([str(VENV_BIN / "throttledjob"), "operator", "--standalone", "-A"],
                          stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp)
    jobs = Watch(cluster, f"/apis/batch/v1/namespaces/{namespace}/jobs",
                 lambda o: (o["metadata"].get("labels") or {}).get("throttledjob.io/name"))
    pods = Watch(cluster, f"/api/v1/namespaces/{namespace}/pods",
                 lambda o: (o["metadata"].get("labels") or {}).get("job-name"))
    for w in (jobs, pods):
        w.start()
        w.ready.wait(30)
    posted: dict[str, float] = {}
    tj_path = f"/apis/throttledjob.io/v1alpha1/namespaces/{namespace}/throttledjobs"

    def create(name: str) -> None:
        posted[name] = time.monotonic()
        cluster.request("POST", tj_path, tj(name, namespace))

    try:
        time.sleep(5)  # the operator's start-up (kopf login, watches) is not the burst
        rss0, cpu0 = proc_figures(op.pid)
        burst = [f"burst-{i:04d}" for i in range(n)]
        burst_busy0 = machine_cpu_seconds()
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(create, burst))
        sent = time.monotonic() - started
        deadline = time.monotonic() + 600
        while len([x for x in burst if x in jobs.seen]) < n and time.monotonic() < deadline:
            time.sleep(0.1)
        all_jobs = max(jobs.seen[x] for x in burst if x in jobs.seen) - started
        machine_burst = (machine_cpu_seconds() - burst_busy0) / (
            time.monotonic() - started) / CPUS
        while len([x for x in burst if x in pods.seen]) < n and time.monotonic() < deadline:
            time.sleep(0.1)
        rss, cpu = proc_figures(op.pid)
        burst_cpu = cpu - cpu0
        burst_writes = writes(cluster, user, namespace, audited)

        settled = settle(op.pid)
        steady = [f"steady-{i:04d}" for i in range(int(rate * steady_seconds))]
        t0 = time.monotonic()
        for i, name in enumerate(steady):
            time.sleep(max(0.0, t0 + i / rate - time.monotonic()))
            create(name)
        while len([x for x in steady if x in jobs.seen]) < len(steady) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        _, cpu_end = proc_figures(op.pid)
        steady_cpu = (cpu_end - cpu) / (time.monotonic() - t0)

        # Every ThrottledJob running (KWOK keeps the pods Running): the poller's lag.
        running = burst + steady
        stepped_tjs = Watch(cluster, tj_path, stepped)
        stepped_tjs.start()
        stepped_tjs.ready.wait(30)
        time.sleep(2 * status_interval)  # the poller at its pace, past the steady stream
        hits0, cpu0, audited0 = sidecars.hits, proc_figures(op.pid)[1], \
            len(cluster.audit(user))
        busy0 = machine_cpu_seconds()
        t_step = time.monotonic()
        sidecars.step()
        lag_deadline = t_step + 10 * status_interval
        while len([x for x in running if x in stepped_tjs.seen]) < len(running) \
                and time.monotonic() < lag_deadline:
            time.sleep(0.1)
        poll_seconds = time.monotonic() - t_step
        poll_cpu = (proc_figures(op.pid)[1] - cpu0) / poll_seconds
        machine_polling = (machine_cpu_seconds() - busy0) / poll_seconds / CPUS
        time.sleep(1.1)  # its count is written each second
        poll_reads = (sidecars.hits - hits0) / (poll_seconds + 1.1)
        poll_writes = writes(cluster, user, namespace, audited0)
        stepped_tjs.stop()
        rss_running = proc_status_mib(op.pid, "VmRSS")
        late = why_not_stepped(cluster, tj_path, stepped_tjs.seen)
        pods_running = sum(p["status"].get("phase") == "Running" for p in cluster.request(
            "GET", f"/api/v1/namespaces/{namespace}/pods")["items"])

        # All deleted: what the operator keeps of them (its own state, kopf's).
        subprocess.run([*kubectl, "delete", "throttledjobs", "--all", "-n", namespace,
                        "--wait=false"], check=True, capture_output=True)
        time.sleep(settle_seconds)
        rss_deleted = proc_status_mib(op.pid, "VmRSS")
        proc_figures_end = proc_figures(op.pid)
    finally:
        for w in (jobs, pods):
            w.stop()
        op.terminate()
        op.wait(30)
        log.close()
        subprocess.run([*kubectl, "delete", "namespace", namespace, "--wait=false"],
                       capture_output=True)
        sidecars.close()

    def latencies(names: list[str], start: dict[str, float], end: dict[str, float]):
        return [end[x] - start[x] for x in names if x in end and x in start]

    create_job = latencies(burst, posted, jobs.seen)
    job_pod = latencies(burst, jobs.seen, pods.seen)
    steady_create_job = latencies(steady, posted, jobs.seen)
    lag = [stepped_tjs.seen[x] - t_step for x in running if x in stepped_tjs.seen]
    ours, kopf = ours_and_kopfs(burst_writes)
    return {
        "throttledjobs": n, "burst_sent_s": round(sent, 1),
        "all_jobs_created_s": round(all_jobs, 1),
        "floor_all_jobs_created_s (plain client, no operator)": round(floor_s, 1),
        "burst_over_floor": round(all_jobs / floor_s, 2),
        "writes_per_throttledjob_in_burst (ours)": round(ours / n, 2),
        "writes_per_throttledjob_in_burst (kopf)": round(kopf / n, 2),
        "writes_in_burst": ", ".join(f"{g or 'core'}/{r} {v} ({by}) {c / n:.2f}"
                                     for (g, r, v, by), c in sorted(burst_writes.items())),
        "jobs_missing": n - len(create_job),
        "create_to_job_p50_s": rounded(percentile(create_job, 0.5), 2),
        "create_to_job_p99_s": rounded(percentile(create_job, 0.99), 2),
        "job_to_pod_p50_s (Job controller)": rounded(percentile(job_pod, 0.5), 2),
        "job_to_pod_p99_s (Job controller)": rounded(percentile(job_pod, 0.99), 2),
        "operator_peak_rss_mib": round(rss), "operator_rss_at_start_mib": round(rss0),
        "operator_cpu_s_in_burst": round(burst_cpu, 1),
        "machine_cpu_busy_in_burst (all cores)": f"{machine_burst:.0%}",
        "steady_stream_started_after_quiet_s": round(settled, 1),
        f"steady_{rate:g}_per_s_create_to_job_p50_s": rounded(percentile(steady_create_job, 0.5),
                                                             2),
        f"steady_{rate:g}_per_s_create_to_job_p99_s": rounded(percentile(steady_create_job, 0.99),
                                                             2),
        "operator_cpu_cores_at_steady_rate": round(steady_cpu, 3),
        "running_throttledjobs": len(running), "pods_running": pods_running,
        "poller_lag_p50_s (sidecar change -> status)": rounded(percentile(lag, 0.5), 2),
        "poller_lag_p99_s": rounded(percentile(lag, 0.99), 2),
        "poller_lag_max_s": rounded(max(lag, default=None)),
        "statuses_never_updated_in_10_intervals": len(running) - len(lag),
        "statuses_not_updated_by_phase_and_error": late,
        "poller_sidecar_reads_per_s": round(poll_reads, 1),
        "poller_status_writes_per_s": round(sum(
            c for (_, r, _, by), c in poll_writes.items()
            if r == "throttledjobs/status" and by == "ours") / poll_seconds, 1),
        "operator_cpu_cores_polling": round(poll_cpu, 3),
        "machine_cpu_busy_polling (all cores)": f"{machine_polling:.0%}",
        "operator_rss_mib_with_all_running (now)": round(rss_running),
        "operator_rss_mib_30s_after_all_deleted": round(rss_deleted),
        "operator_peak_rss_mib_at_end": round(proc_figures_end[0]),
        "status_interval_s": status_interval, "cpus": CPUS,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="ThrottledJobs in the burst")
    parser.add_argument("--rate", type=float, default=10.0, help="steady creates per second")
    parser.add_argument("--steady-seconds", type=float, default=30.0)
    parser.add_argument("--status-interval", type=float, default=10.0,
                        help="seconds between reads of every running pod's sidecar "
                             "(the chart's default, 10)")
    args = parser.parse_args()
    with a_cluster() as cluster:
        figures = run(cluster, args.n, args.rate, args.steady_seconds, args.status_interval)
    print(json.dumps(figures, indent=1))
    print(table(figures))


def table(figures: dict[str, Any]) -> str:
    return markdown([{"figure": k, "value": v} for k, v in figures.items()])


if __name__ == "__main__":
    main()
