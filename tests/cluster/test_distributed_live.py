"""A job of many pods on the real node: two ranks of an unmodified data-parallel PyTorch
script (examples/ddp_train.py: gloo, DistributedDataParallel) as an Indexed Job whose
pods find rank 0 as `<job>-0.<service>` (a headless Service and `subdomain`; the
cluster's DNS gives the pod's IP, which is what gloo dials: no ClusterIP is routed here).

Rank 1's input pipeline does three times rank 0's (`--input-work 1=3`): it costs about
twice rank 0's CPU per step, and every step ends in the gradients' allreduce, so rank 1
sets the pace and rank 0 waits (asleep, not spinning) for it.

- The baseline, what a user writes without a job-wide target: each pod at
  `limits.cpu: 500m`, the even split of one core. Rank 1 runs at its limit, rank 0 at
  about half of its: the job uses about 0.75 core of the 1 it may.
- The job-wide target (`spec.throttle.scope: Job`, one CPU target split across the pods
  by each rank's cost per step): the same Indexed Job as a ThrottledJob's jobTemplate,
  no limits on the container. Skipped until the operator has the field.

Judged by the kernel's own accounting: each pod's workload container sampled every
second from the node (cpuacct), the two added up second by second.
"""

from __future__ import annotations

import copy
import datetime
from dataclasses import dataclass
from typing import Any

import pytest

from testing.cluster_cli import Kubectl, job_finished
from testing.node_samples import CgroupSampler, on_real_node, summed
from throttledjob.operator import crd
from throttledjob.sidecar.stats import nearest_rank
from throttledjob.sidecar.summary import cpu_peak_bound
from tools.k8s import images

pytestmark = pytest.mark.timeout(1200)
RANKS = 2
JOB_CORES = 1.0  # the whole job's CPU: the baseline's two limits, the job-wide target
EVEN_SPLIT = "500m"
# examples/ddp_train.py's defaults (batch 512, width 512, one augmentation round) with
# rank 1's input work x3: here 24 and 50 ms of CPU a step alone, 28 and 55 ms as a pair
# (the allreduce); at 500m each rank 1 takes about 110 ms a step, 500 steps about 55 s.
DDP_STEPS = 500
INPUT_WORK = "1=3"
MASTER_PORT = 29500
RUN_TIMEOUT = 400.0
# The same tolerance as every test of the kernel's quota on this node (the e2e tests:
# summary.cpu_peak_bound, 1.05 at 1 core).
KERNEL_BOUND = cpu_peak_bound(JOB_CORES)
REQUESTS = {"cpu": "100m", "memory": "512Mi"}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def ddp_job_spec(job: str, service: str, resources: dict[str, Any]) -> dict[str, Any]:
    """The Indexed Job's spec: RANKS pods of examples/ddp_train.py in the user's PyTorch
    image, rank from JOB_COMPLETION_INDEX (the Job controller sets it), rank 0 found by
    its hostname in the headless Service `service`; `resources` on the container."""
    container = {
        "name": "work", "image": images.TORCH_IMAGE, "imagePullPolicy": "Never",
        "command": ["python", "/app/ddp_train.py"],
        "args": ["--steps", str(DDP_STEPS), "--input-work", INPUT_WORK, "--timeout", "120"],
        "env": [{"name": "WORLD_SIZE", "value": str(RANKS)},
                {"name": "MASTER_ADDR", "value": f"{job}-0.{service}"},
                {"name": "MASTER_PORT", "value": str(MASTER_PORT)}],
        "resources": resources, "securityContext": CONTAINER_SECURITY}
    return {"completions": RANKS, "parallelism": RANKS, "completionMode": "Indexed",
            "backoffLimit": 0, "activeDeadlineSeconds": int(RUN_TIMEOUT),
            "template": {"spec": on_real_node({"subdomain": service,
                                               "containers": [container]})}}


def headless_service(job: str, namespace: str) -> dict[str, Any]:
    """`<job>-<index>.<job>` for each pod, published before it is ready (the ranks
    rendezvous while they start, as JobSet's Service does)."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": job, "namespace": namespace},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": {"batch.kubernetes.io/job-name": job},
                     "ports": [{"name": "rendezvous", "port": MASTER_PORT}]}}


def even_split(job: str, namespace: str) -> list[dict[str, Any]]:
    """The baseline: a plain Indexed Job, each pod limited to its even share of the
    job's core."""
    spec = ddp_job_spec(job, job, {"requests": REQUESTS, "limits": {"cpu": EVEN_SPLIT}})
    return [headless_service(job, namespace),
            {"apiVersion": "batch/v1", "kind": "Job",
             "metadata": {"name": job, "namespace": namespace}, "spec": spec}]


def job_wide(job: str, namespace: str) -> list[dict[str, Any]]:
    """The same Indexed Job as a ThrottledJob's jobTemplate, no CPU limit on the
    container, one target for the whole job (the operator names the Job as the
    ThrottledJob)."""
    tj = {"apiVersion": crd.API_VERSION, "kind": crd.KIND,
          "metadata": {"name": job, "namespace": namespace},
          "spec": {"jobTemplate": {"spec": ddp_job_spec(job, job, {"requests": REQUESTS})},
                   "throttle": {"scope": "Job",
                                "targets": {"cpu": {"peak": f"{JOB_CORES:g}"}}}}}
    return [headless_service(job, namespace), tj]


@dataclass
class DdpRun:
    ranks: dict[int, dict[str, str]]  # each rank's summary line, rank=R steps=N ...
    samplers: list[CgroupSampler]  # each rank's workload container, in rank order
    cores: list[float]  # both containers' CPU, second by second
    job_seconds: float  # the Job's start to its completion (whole seconds)

    def p99(self) -> float:
        return nearest_rank(self.cores, 0.99) or 0.0

    def cpu_per_step(self, rank: int) -> float:
        return float(self.ranks[rank]["cpu_per_step"])

    def describe(self) -> str:
        return (f"job {self.job_seconds:.0f} s, training "
                f"{[self.ranks[r]['seconds'] for r in sorted(self.ranks)]} s, CPU per step "
                f"{[self.ranks[r]['cpu_per_step'] for r in sorted(self.ranks)]} s, summed "
                f"p99 {self.p99():.3f} of {[round(c, 2) for c in self.cores]}; per pod: "
                + "; ".join(s.describe() for s in self.samplers))


def summary_line(log: str) -> dict[str, str] | None:
    """examples/ddp_train.py's last line as {key: value}; None if it never printed it."""
    lines = [x for x in log.splitlines() if x.startswith("rank=")]
    return dict(kv.split("=", 1) for kv in lines[-1].split()) if lines else None


def run_ddp(kubectl: Kubectl, real_node: Any, namespace: str, job: str,
            objects: list[dict[str, Any]]) -> DdpRun:
    """Apply `objects` (a headless Service and the Indexed Job `job`, or a ThrottledJob
    whose Job the operator names `job`), sample each rank's workload container every
    second until the Job has finished, and read what each rank printed. The Job must
    complete, every rank having run every step."""
    samplers = [CgroupSampler(real_node, kubectl, namespace,
                              f"batch.kubernetes.io/job-name={job},"
                              f"batch.kubernetes.io/job-completion-index={rank}", "work")
                for rank in range(RANKS)]
    kubectl.apply(*objects)
    try:
        done = job_finished(kubectl, namespace, job, timeout=RUN_TIMEOUT)
    finally:
        for sampler in samplers:
            sampler.stop()
    pods = kubectl.json("get", "pods", "-n", namespace, "-l",
                        f"batch.kubernetes.io/job-name={job}")["items"]
    logs = {int(p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]):
            kubectl("logs", "-n", namespace, p["metadata"]["name"], "-c", "work",
                    check=False).stdout for p in pods}
    assert done["status"].get("succeeded") == RANKS, (done["status"], logs)
    ranks = {rank: summary_line(log) for rank, log in logs.items()}
    assert sorted(ranks) == list(range(RANKS)), logs
    for rank, said in ranks.items():
        assert said and said["rank"] == str(rank) and said["steps"] == str(DDP_STEPS), logs
    start, end = (datetime.datetime.fromisoformat(done["status"][k])
                  for k in ("startTime", "completionTime"))
    return DdpRun(ranks=ranks, samplers=samplers, cores=summed(samplers),
                  job_seconds=(end - start).total_seconds())


def test_an_even_split_of_one_core_leaves_the_cheap_rank_waiting(
        real_node: Any, kubectl: Kubectl, namespace: str, torch_image: str) -> None:
    """The baseline: two ranks of uneven cost, each pod at `limits.cpu: 500m`. Both run
    every step, rendezvous through the cluster's DNS, and together stay within the one
    core (each pod's own quota sees to it)."""
    run = run_ddp(kubectl, real_node, namespace, "ddp-even", even_split("ddp-even", namespace))
    ratio = run.cpu_per_step(1) / run.cpu_per_step(0)
    print(f"DDP baseline, {RANKS} pods at limits.cpu {EVEN_SPLIT}: {run.describe()}; "
          f"rank 1 costs {ratio:.2f}x rank 0 per step")
    assert [s.quota_cores for s in run.samplers] == [0.5] * RANKS, run.describe()
    assert run.p99() <= KERNEL_BOUND, run.describe()
    # The workload is as uneven as the job-wide case needs (about 2x here: 1.95).
    assert ratio > 1.5, run.describe()


def test_the_job_wide_throttled_job_is_the_baseline_job_but_for_its_limits() -> None:
    """The two runs compare: the ThrottledJob's jobTemplate is the baseline's Job spec
    without the CPU limit, with the same Service."""
    service, job = even_split("x", "ns")
    wide_service, tj = job_wide("x", "ns")
    assert wide_service == service
    expected = copy.deepcopy(job["spec"])
    del expected["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert tj["spec"]["jobTemplate"]["spec"] == expected


@pytest.mark.skip(reason="needs spec.throttle.scope, not merged yet")
def test_a_job_wide_target_splits_one_core_between_the_ranks_by_their_cost(
        operator: str, real_node: Any, kubectl: Kubectl, torch_image: str) -> None:
    """One 1-core target for the job (`scope: Job`): the operator splits it across the
    two pods by each rank's CPU per step (about 1/3 and 2/3), so the expensive rank no
    longer waits on a half core while the cheap one idles. Held within the same bound as
    the even split, and faster than it, measured beside it in the same namespace."""
    namespace = operator
    baseline = run_ddp(kubectl, real_node, namespace, "ddp-even",
                       even_split("ddp-even", namespace))
    run = run_ddp(kubectl, real_node, namespace, "ddp-wide", job_wide("ddp-wide", namespace))
    speedup = baseline.job_seconds / run.job_seconds
    print(f"DDP job-wide {JOB_CORES:g} core: {run.describe()}; even split: "
          f"{baseline.describe()}; {speedup:.2f}x faster")
    assert run.p99() <= KERNEL_BOUND, run.describe()
    # Split by cost, the pair trains in about 3/4 of the even split's time (42 s against
    # 55 s here with cgroup quotas of 0.34 and 0.66 core set by hand).
    assert speedup > 1.1, (run.describe(), baseline.describe())
