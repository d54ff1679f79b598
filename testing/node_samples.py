"""What the tests of the real node (tools/k8s/node.py) read of its pods: a pod spec as
Pod Security "restricted" requires it, and one-second samples of a container's CPU and
memory from its cgroups, from the node (the kernel's own accounting, not the sidecar's
word); several containers' samples added up second by second.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from pathlib import Path
from typing import Any

from testing.cluster_cli import Kubectl
from throttledjob.sidecar.cpu.cgroups.fs import read_limit
from throttledjob.sidecar.stats import nearest_rank

UID = 65532  # the image's user


def on_real_node(spec: dict[str, Any]) -> dict[str, Any]:
    """A pod spec as "restricted" requires it; with no node selector, it lands on the
    real node (KWOK's is tainted)."""
    return {
        **spec,
        "restartPolicy": "Never",
        "securityContext": {"runAsNonRoot": True, "runAsUser": UID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
    }


def cfs_quota_cores(cgroup: Path) -> float | None:
    """The CFS quota of a container's cpu cgroup, in cores; None when it has none (read
    as the sidecar reads it)."""
    quota, period = read_limit(str(cgroup))
    return None if quota is None else quota / period


class CgroupSampler:
    """One-second samples, from the node, of a container's CPU (cpuacct.usage, cores)
    and of its memory working set (usage less inactive file pages, as the kubelet counts
    it), from when the container's cgroup appears until it is gone."""

    def __init__(self, node: Any, kubectl: Kubectl, namespace: str, selector: str,
                 container: str) -> None:
        self.node, self.kubectl = node, kubectl
        self.namespace, self.selector, self.container = namespace, selector, container
        self.cores: list[float] = []
        self.times: list[float] = []  # Unix time of each sample in `cores`
        self.memory_bytes: list[int] = []
        self.quota_cores: float | None = None  # the kernel's CFS quota; None: unlimited
        self._ran: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _container_id(self) -> str | None:
        pods = self.kubectl.json("get", "pods", "-n", self.namespace, "-l", self.selector)
        for pod in (pods or {}).get("items") or []:
            status = pod.get("status") or {}
            for c in [*(status.get("initContainerStatuses") or []),
                      *(status.get("containerStatuses") or [])]:
                if c["name"] == self.container and c.get("containerID"):
                    return c["containerID"]
        return None

    def _run(self) -> None:
        cpu = memory = quota = None
        while not self._stop.is_set() and cpu is None:
            cid = self._container_id()
            if cid:
                cpu = self.node.container_cgroup(cid, "cpuacct")
                memory = self.node.container_cgroup(cid, "memory")
                quota = self.node.container_cgroup(cid, "cpu")
            if cpu is None:
                time.sleep(0.5)
        if cpu is None or memory is None or quota is None:
            return
        with contextlib.suppress(OSError):
            self.quota_cores = cfs_quota_cores(quota)
        last_t = time.monotonic()
        last_ns = None
        # Wake each second; the sample's time is when the counter was read.
        while not self._stop.wait(max(0.0, last_t + 1.0 - time.monotonic())):
            try:
                # The counter and its time read back to back: a stall while reading
                # memory below must not be counted as CPU time (it read 7% over once).
                before = time.monotonic()
                ns = int((cpu / "cpuacct.usage").read_text())
                now = (before + time.monotonic()) / 2
                usage = int((memory / "memory.usage_in_bytes").read_text())
                stat = dict(line.split() for line in
                            (memory / "memory.stat").read_text().splitlines())
            except OSError:  # the container is gone
                return
            if last_ns is not None:
                self.cores.append((ns - last_ns) / 1e9 / (now - last_t))
                self.times.append(time.time())
            self.memory_bytes.append(usage - int(stat.get("total_inactive_file", 0)))
            last_ns, last_t = ns, now

    def live_quota_cores(self) -> float | None:
        """The container's CFS quota now (it may be resized); None without one, or
        before the container has a cgroup."""
        cid = self._container_id()
        cgroup = self.node.container_cgroup(cid, "cpu") if cid else None
        return cfs_quota_cores(cgroup) if cgroup is not None else None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._ran = self._ran_seconds()

    def _ran_seconds(self) -> float | None:
        """The container's run, start to finish, as the kubelet recorded it (None: not
        finished): the samples may start late, a whole 3 s of a 9 s pod once beside a
        busy process, when its status took that long to name the container."""
        pods = self.kubectl.json("get", "pods", "-n", self.namespace, "-l", self.selector)
        for pod in (pods or {}).get("items") or []:
            for c in (pod.get("status") or {}).get("containerStatuses") or []:
                ended = c.get("state", {}).get("terminated") or {}
                if c["name"] == self.container and ended.get("finishedAt"):
                    start, end = (datetime.datetime.fromisoformat(ended[k])
                                  for k in ("startedAt", "finishedAt"))
                    return (end - start).total_seconds()
        return None

    @property
    def seconds(self) -> float:
        """How long the container ran, to the second (the kubelet's timestamps)."""
        assert self._ran is not None, f"{self.container} has not finished (or no stop())"
        return self._ran

    def p99(self) -> float:
        """Nearest rank, as the sidecar reads it: with fewer than 100 samples, the
        largest. (statistics.quantiles' default extrapolates past the largest sample on
        fewer than 99: 1.04 and 1.02 at the top of 40 read 1.052.)"""
        return nearest_rank(self.cores, 0.99) or 0.0

    def describe(self) -> str:
        """What a failed bound needs to be diagnosed from the CI log alone."""
        return (f"samples {[round(c, 3) for c in self.cores]}, p99 {self.p99():.3f}, "
                f"CFS quota {self.quota_cores} cores")


def summed(samplers: list[CgroupSampler], within: float = 0.6) -> list[float]:
    """Several containers' CPU, second by second: each sample of the sampler with the
    most samples, plus each other's sample nearest in time (none where it has none
    within `within` seconds: not started yet, or ended)."""
    base, *others = sorted(samplers, key=lambda s: -len(s.cores))
    total = []
    for t, cores in zip(base.times, base.cores, strict=True):
        for other in others:
            near = min(zip(other.times, other.cores, strict=True),
                       key=lambda s, t=t: abs(s[0] - t), default=None)
            if near is not None and abs(near[0] - t) <= within:
                cores += near[1]
        total.append(cores)
    return total
