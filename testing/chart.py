"""The chart as helm renders it, and the Pod Security "restricted" profile."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from testing.helpers import require_tool
from testing.paths import CHART

RELEASE, NAMESPACE = "tj", "throttledjob-system"
# The kinds of the Prometheus Operator, as a cluster that has its CRDs serves them: the
# chart refuses its monitoring objects where they are not (`helm template` knows of no
# cluster, so it is told, as Argo CD tells it).
MONITORING_APIS = ("--api-versions", "monitoring.coreos.com/v1/PodMonitor",
                   "--api-versions", "monitoring.coreos.com/v1/PrometheusRule")
# Every optional part on: what the "all-optional-on" renders use.
ALL_ON = {"monitoring": {"podMonitor": {"enabled": True, "labels": {"release": "kps"}},
                         "prometheusRule": {"enabled": True, "labels": {"release": "kps"}},
                         "dashboard": {"enabled": True, "namespace": "grafana",
                                       "annotations": {"grafana_folder": "Batch"}}},
          "networkPolicy": {"enabled": True, "namespaces": ["ml"]},
          "gpu": {"nodeAgent": {"enabled": True, "powerCap": True}},
          "attach": {"enabled": True}}


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([require_tool("helm"), *args], capture_output=True, text=True,
                          timeout=120)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def template(values: dict[str, Any] | None = None, tmp: Path | None = None,
             *extra: str) -> subprocess.CompletedProcess[str]:
    """`helm template` with `values` in a file (so types are kept, unlike --set)."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, *MONITORING_APIS,
            *extra]
    if values is not None:
        assert tmp is not None
        path = tmp / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        args += ["-f", str(path)]
    return helm(*args, check=False)


def render(values: dict[str, Any] | None = None, tmp: Path | None = None,
           *extra: str) -> list[dict[str, Any]]:
    proc = template(values, tmp, *extra)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                   "persistentVolumeClaim", "projected", "secret"}


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """The Pod Security Standards "restricted" profile (baseline included), as the
    PodSecurity admission plugin checks a pod spec (kubernetes.io/docs/concepts/security/
    pod-security-standards)."""
    out = []
    psc = pod.get("securityContext") or {}
    for key in ("hostPID", "hostIPC", "hostNetwork"):
        if pod.get(key):
            out.append(key)
    for v in pod.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            out.append(f"volume {v['name']}: {sorted(kinds - ALLOWED_VOLUMES)}")
    if psc.get("sysctls"):
        out.append("sysctls")
    if (psc.get("seLinuxOptions") or {}).get("type") not in (None, "", "container_t",
                                                            "container_init_t",
                                                            "container_kvm_t"):
        out.append("seLinux type")
    containers = [*pod.get("initContainers", []), *pod["containers"],
                  *pod.get("ephemeralContainers", [])]
    for c in containers:
        sc = c.get("securityContext") or {}
        merged = {**{k: psc[k] for k in ("runAsNonRoot", "runAsUser", "seccompProfile")
                     if k in psc}, **sc}
        name = c["name"]
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation not false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name}: capabilities not dropped")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: capabilities added")
        if merged.get("runAsNonRoot") is not True:
            out.append(f"{name}: runAsNonRoot not true")
        if merged.get("runAsUser") == 0 or psc.get("runAsUser") == 0:
            out.append(f"{name}: runAsUser 0")
        if (merged.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault",
                                                                    "Localhost"):
            out.append(f"{name}: seccompProfile")
        if sc.get("procMount") not in (None, "Default"):
            out.append(f"{name}: procMount")
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                out.append(f"{name}: hostPort")
    return out
