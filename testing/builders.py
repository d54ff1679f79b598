"""The operator's children as its handler sends them, for the builder tests."""

from __future__ import annotations

import copy
from typing import Any

import kopf

from throttledjob.operator.children import build_child, build_configmap
from throttledjob.operator.config import OperatorSettings
from throttledjob.operator.validation import validate

SETTINGS = OperatorSettings()


def owned(tj: dict[str, Any]) -> dict[str, Any]:
    """The TJ as the API server returns it (uid, generation)."""
    tj = copy.deepcopy(tj)
    tj["metadata"].update(uid="0b3c8d1e-0000-4000-8000-000000000001", generation=1)
    return tj


def built(tj: dict[str, Any], settings: OperatorSettings = SETTINGS
          ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Job, ConfigMap) as the handler sends them: built, then kopf.adopt-ed."""
    tj = owned(tj)
    doc = validate(tj)
    job = build_child(tj, doc, settings)
    cm = build_configmap(tj["metadata"]["name"], tj["spec"], doc)
    kopf.adopt([job, cm], owner=tj)
    return job, cm


def pod_of(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["template"]["spec"]


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """The Pod Security "restricted" checks that a pod template can fail."""
    out = []
    psc = pod.get("securityContext") or {}
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        sc = {**{k: psc[k] for k in ("runAsNonRoot", "runAsUser", "seccompProfile")
                 if k in psc}, **(c.get("securityContext") or {})}
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{c['name']}: allowPrivilegeEscalation")
        if "ALL" not in (sc.get("capabilities") or {}).get("drop", []):
            out.append(f"{c['name']}: capabilities not dropped")
        if set((sc.get("capabilities") or {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{c['name']}: capabilities added")
        if sc.get("runAsNonRoot") is not True or sc.get("runAsUser") == 0:
            out.append(f"{c['name']}: may run as root")
        if (sc.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
            out.append(f"{c['name']}: seccomp")
        if sc.get("privileged"):
            out.append(f"{c['name']}: privileged")
    for key in ("hostPID", "hostIPC", "hostNetwork"):
        if pod.get(key):
            out.append(key)
    return out
