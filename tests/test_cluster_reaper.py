"""The test cluster's reaper (tools/k8s/cluster.reap_abandoned): a run killed with its
cluster up leaves that cluster's directory; the next run's start tears it down, and
never touches a cluster whose processes still run or one that is being started."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tools.k8s import cluster as k8s


def cluster_dir(parent: Path, name: str, pids: dict[str, int]) -> Path:
    d = parent / name
    d.mkdir()
    (d / "state.json").write_text(json.dumps({"pids": pids}))
    return d


def test_only_a_cluster_whose_processes_are_all_gone_is_torn_down(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    running = subprocess.Popen(["sleep", "60"])
    try:
        killed = cluster_dir(tmp_path, f"{k8s.TEMP_PREFIX}killed", {"etcd": gone.pid})
        half = cluster_dir(tmp_path, f"{k8s.TEMP_PREFIX}half",
                           {"etcd": gone.pid, "kube-apiserver": running.pid})
        starting = cluster_dir(tmp_path, f"{k8s.TEMP_PREFIX}starting", {})
        other = cluster_dir(tmp_path, "someone-elses", {"etcd": gone.pid})

        assert k8s.reap_abandoned(tmp_path) == [killed]

        assert not killed.exists()
        assert half.exists() and starting.exists() and other.exists()
        assert running.poll() is None, "the reaper stopped a live cluster's process"
    finally:
        running.kill()
        running.wait()
