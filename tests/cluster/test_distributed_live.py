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
  no limits on the container; and the same ranks as a JobSet.
- Two independent pods of unequal length under a job-wide target: the short one's share
  goes to the long one when it ends.

- The workloads users already run, attached (attach mode, the chart's webhook): the same
  two ranks as a Kubeflow TrainJob under a job-wide target; a CronJob's Job joined by
  label and a JobSet named by reference, each held to its own target.

Judged by the kernel's own accounting: each pod's workload container sampled every
second from the node (cpuacct), the two added up second by second.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest

from testing.cluster_cli import Kubectl, wait_json
from testing.helpers import wait_for
from testing.node_samples import CgroupSampler, on_real_node, summed
from testing.paths import ROOT
from throttledjob.contracts.policy import parse_cpu_quantity
from throttledjob.operator import api_names
from throttledjob.operator.attach import THROTTLE_LABEL
from throttledjob.operator.children import LABEL_NAME
from throttledjob.sidecar.stats import nearest_rank
from throttledjob.sidecar.summary import cpu_peak_bound
from tools.k8s import images

# bench/distributed.py sets the pairs (THROTTLEDJOB_DDP_PAIRS, three or more) and reads
# the figures the job-wide test writes, and judges them against its goal (0.85x); the
# suite runs one pair, the behaviour once: the split by cost in the status (which a
# broken split fails whatever the timing), within the bound, and faster than the even
# split beyond one pair's noise (single pairs read 0.79-0.89x since the split follows a
# 10-second cost; 0.94x before; no split at all is 1.0x).
PAIRS = int(os.environ.get("THROTTLEDJOB_DDP_PAIRS", "1"))
# Single pairs trained 0.77-0.94x and once, under fresh-clone CI, 0.995x: a probe's lifted
# thread cap had put a rank at 2 threads, and the split weighed the ranks by their start
# (docs/dev/benchmarks-history.md). Both mended, single pairs trained 0.80x and 0.81x, and
# under a later fresh-clone CI 0.969x with the split made as it should (0.30 and 0.70 core)
# but every step costing 2.5x its usual CPU in both arms (2026-12-07): one pair's ratio
# is at the machine's mercy. One pair judges the behaviour (the split by cost, below) and
# never slower than the even split; three judge the gain (bench.distributed, 0.92, its
# figures in docs/dev/benchmarks.md).
TRAINING_BOUND = 1.0 if PAIRS == 1 else 0.92
JOB_BOUND = 1.10 if PAIRS == 1 else 1.05
pytestmark = pytest.mark.timeout(300 + 400 * PAIRS)
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
# Two pods' samples summed: each pod's quota holds its own share within the kernel's bound,
# but their 100 ms periods are not aligned and a second may hold a little more of each;
# a JobSet run read p99 1.06 on a new VM (2026-11-27). Held to the same bound, the even
# split (the baseline) and the job-wide runs.
SUMMED_BOUND = KERNEL_BOUND + 0.05
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
    ThrottledJob); `inject: Auto`, so each rank reports its optimizer steps and the
    split weighs its CPU cost of a step, with no change to the script."""
    tj = {"apiVersion": api_names.API_VERSION, "kind": api_names.KIND,
          "metadata": {"name": job, "namespace": namespace},
          "spec": {"jobTemplate": {"spec": ddp_job_spec(job, job, {"requests": REQUESTS})},
                   "throttle": {"scope": "Job", "inject": "Auto",
                                "targets": {"cpu": {"peak": f"{JOB_CORES:g}"}}}}}
    return [headless_service(job, namespace), tj]


@dataclass
class DdpRun:
    ranks: dict[int, dict[str, str]]  # each rank's summary line, rank=R steps=N ...
    samplers: list[CgroupSampler]  # each rank's workload container, in rank order
    cores: list[float]  # both containers' CPU, second by second
    job_seconds: float | None  # the Job's start to its completion (whole seconds)
    status: dict[str, Any]  # a ThrottledJob's last status with a whole split of every rank
    # each change of the ranks' limits in status.ranks: (seconds from apply, limits, paces)
    split_history: list[tuple[int, list[Any], list[Any]]]
    held: list[list[float]]  # each second's whole split: the ranks' limits, in rank order

    def held_ratio(self) -> float:
        """Rank 1's limit over rank 0's, the median over the seconds a whole split was
        held: what the split was while the ranks trained. The last status alone is not
        it: once training ends, both ranks cost the same and the split drifts back."""
        return statistics.median(b / a for a, b in self.held) if self.held else 0.0

    def p99(self) -> float:
        return nearest_rank(self.cores, 0.99) or 0.0

    def figures(self) -> dict[str, Any]:
        return {"job_seconds": self.job_seconds, "training_seconds": self.training_seconds(),
                "p99_cores": self.p99(),
                "cpu_per_step": [self.cpu_per_step(r) for r in sorted(self.ranks)]}

    def training_seconds(self) -> float:
        """The slowest rank's training loop, by its own clock (all end together)."""
        return max(float(said["seconds"]) for said in self.ranks.values())

    def cpu_per_step(self, rank: int) -> float:
        return float(self.ranks[rank]["cpu_per_step"])

    def describe(self) -> str:
        return (f"job {self.job_seconds} s, training "
                f"{[self.ranks[r]['seconds'] for r in sorted(self.ranks)]} s, CPU per step "
                f"{[self.ranks[r]['cpu_per_step'] for r in sorted(self.ranks)]} s, summed "
                f"p99 {self.p99():.3f} of {[round(c, 2) for c in self.cores]}; threads "
                f"{[self.ranks[r].get('threads') for r in sorted(self.ranks)]}; "
                + (f"split (s, limits, steps/s) {self.split_history}; "
                   if self.split_history else "")
                + "per pod: " + "; ".join(s.describe() for s in self.samplers))


def summary_line(log: str) -> dict[str, str] | None:
    """examples/ddp_train.py's last line as {key: value}; None if it never printed it."""
    lines = [x for x in log.splitlines() if x.startswith("rank=")]
    return dict(kv.split("=", 1) for kv in lines[-1].split()) if lines else None


JOB_NAME = "batch.kubernetes.io/job-name"
JOB_INDEX = "batch.kubernetes.io/job-completion-index"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_INDEX = "jobset.sigs.k8s.io/job-global-index"


def run_ddp(kubectl: Kubectl, real_node: Any, namespace: str, job: str,
            objects: list[dict[str, Any]], jobset: bool = False,
            rank_label: str | None = None, container: str = "work") -> DdpRun:
    """Apply `objects` (a headless Service and the Indexed Job `job`, a ThrottledJob
    whose Job the operator names `job`, or one whose child is the JobSet `job`), sample
    each rank's workload container every second until the child has finished, and read
    what each rank printed. It must complete, every rank having run every step. A
    JobSet's ranks are its Jobs' (JOBSET_INDEX), or `rank_label`'s."""
    name_label = JOBSET_NAME if jobset else JOB_NAME
    rank_label = rank_label or (JOBSET_INDEX if jobset else JOB_INDEX)
    samplers = [CgroupSampler(real_node, kubectl, namespace,
                              f"{name_label}={job},{rank_label}={rank}", container)
                for rank in range(RANKS)]
    kubectl.apply(*objects)
    split = SplitWatch(kubectl, namespace, job) if any(
        o["kind"] == api_names.KIND for o in objects) else None
    try:
        done = wait_json(kubectl, lambda j: any(
            c["type"] in ("Complete", "Completed", "Failed") and c["status"] == "True"
            for c in (j.get("status") or {}).get("conditions") or []),
            "jobset" if jobset else "job", "-n", namespace, job, what=f"{job} to finish",
            timeout=RUN_TIMEOUT)
    finally:
        for sampler in samplers:
            sampler.stop()
        if split:
            split.stop()
    pods = kubectl.json("get", "pods", "-n", namespace, "-l", f"{name_label}={job}")["items"]
    logs = {int(p["metadata"]["labels"][rank_label]):
            kubectl("logs", "-n", namespace, p["metadata"]["name"], "-c", container,
                    check=False).stdout for p in pods}
    ended = {c["type"] for c in done["status"]["conditions"] if c["status"] == "True"}
    assert ended & {"Complete", "Completed"} and "Failed" not in ended, (done["status"], logs)
    ranks = {rank: summary_line(log) for rank, log in logs.items()}
    assert sorted(ranks) == list(range(RANKS)), logs
    for rank, said in ranks.items():
        assert said and said["rank"] == str(rank) and said["steps"] == str(DDP_STEPS), logs
    seconds = None
    if not jobset:
        start, end = (datetime.datetime.fromisoformat(done["status"][k])
                      for k in ("startTime", "completionTime"))
        seconds = (end - start).total_seconds()
    return DdpRun(ranks=ranks, samplers=samplers, cores=summed(samplers), job_seconds=seconds,
                  status=split.last if split else {},
                  split_history=split.history if split else [],
                  held=split.held if split else [])


class SplitWatch:
    """The ThrottledJob's status each second while it runs: the last whole split that
    shows every rank (at the end, the first rank to finish leaves status.ranks). Whole:
    its limits hand out the job's target. A move is made in two steps (the shrink, then
    the grow an interval later, once the room exists), and a status between them shows
    half a move. Each change of the ranks' limits is kept in `history`: a split that
    moves late is a slower run, and only the history tells it from a split that moved
    and did not help."""

    def __init__(self, kubectl: Kubectl, namespace: str, name: str) -> None:
        self.kubectl, self.namespace, self.name = kubectl, namespace, name
        self.last: dict[str, Any] = {}
        self.held: list[list[float]] = []
        self.history: list[tuple[int, list[Any], list[Any]]] = []
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            tj = self.kubectl.json("get", "tj", "-n", self.namespace, self.name) or {}
            status = tj.get("status") or {}
            ranks = status.get("ranks") or []
            limits = [r.get("limitCores") for r in ranks]
            if ranks and (not self.history or self.history[-1][1] != limits):
                self.history.append((round(time.monotonic() - self._start), limits,
                                     [r.get("stepsPerSecond") for r in ranks]))
            if len(ranks) == RANKS and \
                    sum(r.get("limitCores") or 0 for r in ranks) >= 0.95 * JOB_CORES:
                self.last = status
                self.held.append([r["limitCores"] for r in ranks])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def test_the_job_wide_throttled_job_is_the_baseline_job_but_for_its_limits() -> None:
    """The two runs compare: the ThrottledJob's jobTemplate is the baseline's Job spec
    without the CPU limit, with the same Service."""
    service, job = even_split("x", "ns")
    wide_service, tj = job_wide("x", "ns")
    assert wide_service == service
    expected = copy.deepcopy(job["spec"])
    del expected["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert tj["spec"]["jobTemplate"]["spec"] == expected


FIGURES = ROOT / "bench" / "out" / "distributed.json"


def test_a_job_wide_target_splits_one_core_between_the_ranks_by_their_cost(
        operator: str, real_node: Any, kubectl: Kubectl, torch_image: str) -> None:
    """One 1-core target for the job (`scope: Job`): the operator splits it across the
    two pods by each rank's CPU per step (about 1/3 and 2/3), so the expensive rank no
    longer waits on a half core while the cheap one idles. Held within the same bound as
    the even split, and faster than it, measured beside it in the same namespace (in
    pairs, the order alternating)."""
    namespace = operator
    pairs = []
    for i in range(PAIRS):
        runs = {}
        for kind in (("even", "wide") if i % 2 == 0 else ("wide", "even")):
            name = f"ddp-{kind}-{i}"
            objects = even_split(name, namespace) if kind == "even" else \
                job_wide(name, namespace)
            runs[kind] = run_ddp(kubectl, real_node, namespace, name, objects)
        wide, even = runs["wide"], runs["even"]
        # The baseline is what it says: each pod's own quota at the even share, and the
        # workload as uneven as the split needs (rank 1 about 2x rank 0 a step: 1.9).
        assert [s.quota_cores for s in even.samplers] == [0.5] * RANKS, even.describe()
        assert even.p99() <= SUMMED_BOUND, even.describe()
        assert even.cpu_per_step(1) > 1.5 * even.cpu_per_step(0), even.describe()
        pairs.append({
            "training_ratio": wide.training_seconds() / even.training_seconds(),
            "job_ratio": (wide.job_seconds or 0) / (even.job_seconds or 1),
            "wide": wide.figures(), "even": even.figures()})
        print(f"pair {i}: DDP job-wide {JOB_CORES:g} core: {wide.describe()}; even split: "
              f"{even.describe()}; training {pairs[-1]['training_ratio']:.2f}x, job "
              f"{pairs[-1]['job_ratio']:.2f}x the even split's")
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    FIGURES.write_text(json.dumps(pairs, indent=1))
    for pair in pairs:
        assert pair["wide"]["p99_cores"] <= SUMMED_BOUND, pair
    # What the ThrottledJob showed while it ran: the split it made, and why.
    name = f"ddp-wide-{PAIRS - 1}"
    assert runs["wide"].status, "no status with a whole split of both ranks"
    wide_status, ranks = runs["wide"].status["jobWide"], runs["wide"].status["ranks"]
    print(f"status.jobWide {wide_status}; status.ranks {ranks}")
    assert wide_status["targetCores"] == JOB_CORES, wide_status
    assert wide_status["limitCores"] <= JOB_CORES, wide_status
    assert [r["index"] for r in ranks] == list(range(RANKS)), ranks
    assert runs["wide"].held_ratio() > 1.5, runs["wide"].held
    events = kubectl.json("get", "events", "-n", namespace, "--field-selector",
                          f"involvedObject.name={name},reason=SplitChanged")["items"]
    assert events, "no SplitChanged event"
    # Split by cost, the pair trains in about 3/4 of the even split's time (42 s against
    # 55 s here with cgroup quotas of 0.34 and 0.66 core set by hand; the ideal split of
    # costs 1:1.9 gives 0.77x). Measured 0.77-0.94x over single pairs and a 3-pair run,
    # once 0.995x (docs/dev/benchmarks-history.md); no split at all is 1.0x. The Job's wall
    # time also holds each pod's start, where the sidecar and the guard start before the
    # workload, and the first intervals before the split has moved: 0.83-1.05x, judged only
    # as never slower than the even split beyond the noise of two pods' start. Judged last,
    # so that a slow pair has printed its split's history and status first.
    assert statistics.median(p["training_ratio"] for p in pairs) <= TRAINING_BOUND, pairs
    assert statistics.median(p["job_ratio"] for p in pairs) <= JOB_BOUND, pairs


def jobset_job_wide(name: str, namespace: str) -> dict[str, Any]:
    """The same two ranks as a JobSet (two replicas of a one-pod Job, as a TrainJob
    renders), under the same job-wide target. JobSet makes the headless Service and sets
    each pod's subdomain; rank 0 is `<jobset>-worker-0-0.<jobset>`; each rank is its Job's
    global index (JobSet's label, through the downward API)."""
    spec = ddp_job_spec(name, name, {"requests": REQUESTS})
    pod = spec["template"]["spec"]
    del pod["subdomain"]
    (work,) = pod["containers"]
    work["env"] = [e for e in work["env"] if e["name"] != "MASTER_ADDR"] + [
        {"name": "MASTER_ADDR", "value": f"{name}-worker-0-0.{name}"},
        {"name": "RANK", "valueFrom": {"fieldRef": {
            "fieldPath": f"metadata.labels['{JOBSET_INDEX}']"}}}]
    job = {"spec": {**{k: v for k, v in spec.items()
                       if k not in ("completions", "parallelism", "completionMode")},
                    "completions": 1, "parallelism": 1}}
    return {"apiVersion": api_names.API_VERSION, "kind": api_names.KIND,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"jobSetTemplate": {"spec": {
                         "network": {"enableDNSHostnames": True,
                                     "publishNotReadyAddresses": True},
                         "replicatedJobs": [{"name": "worker", "replicas": RANKS,
                                             "template": job}]}},
                     "throttle": {"scope": "Job",
                                  "targets": {"cpu": {"peak": f"{JOB_CORES:g}"}}}}}


def test_a_jobset_under_a_job_wide_target_splits_it_between_its_jobs(
        jobset_controller: None, operator: str, real_node: Any, kubectl: Kubectl,
        torch_image: str) -> None:
    """The second child kind: the ThrottledJob makes a JobSet; JobSet makes two Jobs of
    one pod each and their Service; the operator splits the one core between the two
    pods by their cost, within the same bound, and the ThrottledJob ends Succeeded."""
    namespace, name = operator, "ddp-set"
    run = run_ddp(kubectl, real_node, namespace, name, [jobset_job_wide(name, namespace)],
                  jobset=True)
    ranks = run.status["ranks"]
    print(f"DDP JobSet, job-wide {JOB_CORES:g} core: {run.describe()}; status.ranks {ranks}")
    assert run.p99() <= SUMMED_BOUND, run.describe()
    assert len(ranks) == RANKS and all(r["pod"].startswith(f"{name}-worker-") for r in ranks)
    assert run.held_ratio() > 1.5, run.held
    wait_json(kubectl, lambda t: (t.get("status") or {}).get("phase") == "Succeeded", "tj",
              "-n", namespace, name, what="the ThrottledJob Succeeded")


TRAINER_API = "trainer.kubeflow.org/v1alpha1"


def trainjob_and_runtime(name: str, namespace: str) -> list[dict[str, Any]]:
    """The same two ranks as a Kubeflow TrainJob, as its user submits one: a
    TrainingRuntime of the platform's (one replicatedJob `node`, plain ML policy) and the
    TrainJob naming it with two nodes. Trainer renders it into a JobSet of its name whose
    `node` Job runs the two pods, indexed; rank 0 is `<name>-node-0-0.<name>`."""
    spec = ddp_job_spec(name, name, {"requests": REQUESTS})
    pod = spec["template"]["spec"]
    del pod["subdomain"]
    (work,) = pod["containers"]
    work["name"] = "node"  # the trainer container Trainer looks for
    work["env"] = [e for e in work["env"] if e["name"] != "MASTER_ADDR"] + [
        {"name": "MASTER_ADDR", "value": f"{name}-node-0-0.{name}"}]
    job = {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
           "spec": {"completionMode": "Indexed", "backoffLimit": 0,
                    "template": spec["template"]}}
    runtime = {"apiVersion": TRAINER_API, "kind": "TrainingRuntime",
               "metadata": {"name": f"{name}-runtime", "namespace": namespace},
               "spec": {"mlPolicy": {"numNodes": 1}, "template": {"spec": {
                   "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
                   "replicatedJobs": [{"name": "node", "template": job}]}}}}
    trainjob = {"apiVersion": TRAINER_API, "kind": "TrainJob",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"runtimeRef": {"apiGroup": "trainer.kubeflow.org",
                                        "kind": "TrainingRuntime", "name": f"{name}-runtime"},
                         "trainer": {"numNodes": RANKS}}}
    return [runtime, trainjob]


def attached_job_wide(name: str, namespace: str) -> dict[str, Any]:
    """A ThrottledJob that names the TrainJob `name` and holds it to the job-wide target."""
    return {"apiVersion": api_names.API_VERSION, "kind": api_names.KIND,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"workloadRef": {"apiVersion": TRAINER_API, "kind": "TrainJob",
                                     "name": name},
                     "throttle": {"scope": "Job",
                                  "targets": {"cpu": {"peak": f"{JOB_CORES:g}"}}}}}


def test_a_trainjob_attached_by_reference_is_held_to_its_job_wide_target(
        trainer_controller: None, operator: str, real_node: Any, kubectl: Kubectl,
        torch_image: str) -> None:
    """The workload users already run: a TrainJob, not changed by a single field, its
    pods throttled by the chart's admission webhook (attach.enabled, called by the API
    server through its Service) as Trainer's JobSet makes them: each starts at the even
    share of the job's core, the split moves them by cost, the kernel's accounting holds
    the two within the same bound, and the ThrottledJob ends with its workload."""
    namespace, name = operator, "ddp-trainjob"
    run = run_ddp(kubectl, real_node, namespace, name,
                  [attached_job_wide(name, namespace), *trainjob_and_runtime(name, namespace)],
                  jobset=True, rank_label=JOB_INDEX, container="node")
    ranks = run.status.get("ranks") or []
    print(f"DDP TrainJob, attached, job-wide {JOB_CORES:g} core: {run.describe()}; "
          f"status.ranks {ranks}")
    assert run.p99() <= SUMMED_BOUND, run.describe()
    assert [s.quota_cores for s in run.samplers] != [None] * RANKS, run.describe()
    assert len(ranks) == RANKS and all(r["pod"].startswith(f"{name}-node-") for r in ranks)
    assert run.held_ratio() > 1.5, run.held
    trainjob = kubectl.json("get", "trainjob", "-n", namespace, name)
    assert not trainjob["metadata"].get("ownerReferences")
    assert not any(k.startswith("throttledjob.io/")
                   for k in trainjob["metadata"].get("labels") or {})
    wait_json(kubectl, lambda t: (t.get("status") or {}).get("phase") == "Succeeded", "tj",
              "-n", namespace, name, what="the ThrottledJob Succeeded")


ATTACHED_CORES = 0.5
# Two Pythons of about 3 s of one core each: held to half a core, about 12 s.
BURNER = ["sh", "-c", "python -c 'for _ in range(100_000_000): pass' & a=$!; "
                      "python -c 'for _ in range(100_000_000): pass' & b=$!; "
                      "wait $a && wait $b"]


def burner_pod() -> dict[str, Any]:
    return on_real_node({"containers": [{
        "name": "work", "image": images.PRODUCT_IMAGE, "imagePullPolicy": "Never",
        "command": BURNER, "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
        "securityContext": CONTAINER_SECURITY}]})


def test_a_cronjobs_job_by_label_and_a_jobset_by_reference_hold_their_targets(
        trainer_controller: None, operator: str, real_node: Any, kubectl: Kubectl) -> None:
    """The other workloads users already run, side by side on the real node: a CronJob
    whose Jobs join a standing ThrottledJob by one label on its jobTemplate (a Job made
    from it, as `kubectl create job --from` does), and a JobSet a ThrottledJob names.
    Each pod asks for two cores and is held to half of one by the kernel's quota the
    webhook set, within the product's bound; the user's objects are left as written."""
    namespace = operator
    # Hard: a 4x slowdown passes any budget, which would lift the limit.
    throttle = {"targets": {"cpu": {"peak": f"{ATTACHED_CORES:g}"}, "hold": "Hard"},
                "enforcement": "Quota"}
    tj = {"apiVersion": api_names.API_VERSION, "kind": api_names.KIND}
    labeled = {**tj, "metadata": {"name": "nightly", "namespace": namespace},
               "spec": {"labeledWorkloads": {}, "throttle": throttle}}
    by_ref = {**tj, "metadata": {"name": "burn-set", "namespace": namespace},
              "spec": {"workloadRef": {"apiVersion": "jobset.x-k8s.io/v1alpha2",
                                       "kind": "JobSet", "name": "burn-set"},
                       "throttle": throttle}}
    job = {"spec": {"backoffLimit": 0, "template": {"spec": burner_pod()}}}
    cronjob = {"apiVersion": "batch/v1", "kind": "CronJob",
               "metadata": {"name": "nightly", "namespace": namespace},
               "spec": {"schedule": "0 0 1 1 *", "suspend": True, "jobTemplate": {
                   "metadata": {"labels": {THROTTLE_LABEL: "nightly"}}, **job}}}
    jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
              "metadata": {"name": "burn-set", "namespace": namespace},
              "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": job}]}}
    kubectl.apply(labeled, by_ref)
    wait_json(kubectl, lambda t: (t.get("status") or {}).get("phase") == "Running", "tj",
              "-n", namespace, "nightly", what="the standing ThrottledJob Running")
    samplers = [CgroupSampler(real_node, kubectl, namespace, selector, "work") for selector
                in (f"{JOB_NAME}=nightly-1", f"{JOBSET_NAME}=burn-set")]
    try:
        kubectl.apply(cronjob, jobset)
        kubectl("create", "job", "-n", namespace, "--from=cronjob/nightly", "nightly-1")
        for kind, name in (("job", "nightly-1"), ("jobset", "burn-set")):
            wait_json(kubectl, lambda j: any(
                c["type"] in ("Complete", "Completed") and c["status"] == "True"
                for c in (j.get("status") or {}).get("conditions") or []),
                kind, "-n", namespace, name, what=f"{name} to complete", timeout=RUN_TIMEOUT)
    finally:
        for sampler in samplers:
            sampler.stop()
    for sampler in samplers:
        described = f"{sampler.selector}: p99 {sampler.p99():.3f} of {sampler.cores}"
        print(described)
        assert sampler.quota_cores == ATTACHED_CORES, described
        assert len(sampler.cores) >= 4 and max(sampler.cores) > 0.4, described
        assert sampler.p99() <= cpu_peak_bound(ATTACHED_CORES), described
    made = kubectl.json("get", "cronjob", "-n", namespace, "nightly")
    assert made["spec"]["jobTemplate"]["metadata"]["labels"] == {THROTTLE_LABEL: "nightly"}
    assert not (kubectl.json("get", "jobset", "-n", namespace, "burn-set")["metadata"]
                .get("labels") or {}).get(LABEL_NAME)
    wait_json(kubectl, lambda t: (t.get("status") or {}).get("phase") == "Succeeded", "tj",
              "-n", namespace, "burn-set", what="the JobSet's ThrottledJob Succeeded")


def applied_limits(kubectl: Kubectl, namespace: str, selector: str) -> dict[int, float]:
    """Each running pod's workload CPU limit as the kubelet applied it, by index."""
    pods = kubectl.json("get", "pods", "-n", namespace, "-l", selector)["items"]
    out = {}
    for pod in pods:
        if (pod.get("status") or {}).get("phase") != "Running":
            continue
        for c in pod["status"].get("containerStatuses") or []:
            cpu = ((c.get("resources") or {}).get("limits") or {}).get("cpu")
            if c["name"] == "work" and cpu:
                out[int(pod["metadata"]["labels"][JOB_INDEX])] = parse_cpu_quantity(
                    cpu, "limit")
    return out


def test_when_a_short_pod_ends_the_long_one_gets_the_whole_job_wide_target(
        operator: str, real_node: Any, kubectl: Kubectl) -> None:
    """Two independent pods of unequal length (no allreduce, no steps: split by measured
    use) under a job-wide 1 core: while both run they share it; once the short one has
    ended, the kubelet holds the long one at the whole core."""
    namespace, name = operator, "short-long"
    busy = ("import os, time\n"
            "end = time.time() + (10 if os.environ['JOB_COMPLETION_INDEX'] == '0' else 60)\n"
            "while time.time() < end: pass\n")
    container = {"name": "work", "image": images.PRODUCT_IMAGE, "imagePullPolicy": "Never",
                 "command": ["python", "-c", busy],
                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                 "securityContext": CONTAINER_SECURITY}
    tj = {"apiVersion": api_names.API_VERSION, "kind": api_names.KIND,
          "metadata": {"name": name, "namespace": namespace},
          "spec": {"jobTemplate": {"spec": {
                       "completions": 2, "parallelism": 2, "completionMode": "Indexed",
                       "backoffLimit": 0,
                       "template": {"spec": on_real_node({"containers": [container]})}}},
                   "throttle": {"scope": "Job", "targets": {"cpu": {"peak": "1"}}}}}
    kubectl.apply(tj)
    selector = f"{JOB_NAME}={name}"
    wait_for(lambda: len(applied_limits(kubectl, namespace, selector)) == 2, 120,
             interval=0.5, what="both pods running")
    shared = applied_limits(kubectl, namespace, selector)
    assert sum(shared.values()) <= JOB_CORES + 1e-9, shared
    wait_for(lambda: applied_limits(kubectl, namespace, selector) == {1: JOB_CORES}, 50,
             interval=0.5, what="the long pod alone at the whole core")
    sampler = CgroupSampler(real_node, kubectl, namespace, f"{selector},{JOB_INDEX}=1", "work")
    time.sleep(6)
    sampler.stop()
    alone = sorted(sampler.cores)
    print(f"short/long: both running {shared}; the long one alone {alone}")
    # Using it: a busy loop alone under 1 core reads about 1 core a second.
    assert alone and alone[len(alone) // 2] > 0.8, sampler.describe()
