"""Manifests the tests start from: a small valid ThrottledJob, the Job the operator
builds for one, and a ThrottledJob whose pods KWOK runs for a while."""

from __future__ import annotations

from typing import Any

from throttledjob.operator import api_names
from tools.k8s.cluster import ON_KWOK

NAMESPACE = "ml"


def policy_with(path: str, value: Any) -> dict[str, Any]:
    """A `spec.throttle` document with only `value` at the dotted `path`."""
    doc: dict[str, Any] = {}
    node = doc
    *groups, key = path.split(".")
    for g in groups:
        node = node.setdefault(g, {})
    node[key] = value
    return doc


def make_tj(name: str = "train", *, throttle: dict[str, Any] | None = None,
            parameters: dict[str, Any] | None = None, **pod: Any) -> dict[str, Any]:
    """A small valid ThrottledJob; keyword arguments override pod spec fields."""
    container = {"name": "trainer", "image": "python:3.11-slim",
                 "command": ["python", "train.py"],
                 "resources": {"limits": {"cpu": "2", "memory": "1Gi"}},
                 "securityContext": {"allowPrivilegeEscalation": False,
                                     "capabilities": {"drop": ["ALL"]}}}
    pod_spec = {"restartPolicy": "Never", "containers": [container],
                "securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                                    "seccompProfile": {"type": "RuntimeDefault"}}, **pod}
    spec: dict[str, Any] = {
        "jobTemplate": {"metadata": {"labels": {"team": "vision"}},
                        "spec": {"backoffLimit": 0, "template": {"spec": pod_spec}}},
        "throttle": throttle if throttle is not None else {
            "targets": {"cpu": {"peak": "1500m"}}, "maxSlowdown": 1.25,
            "mode": "Adaptive", "enforcement": "Cooperative", "intervalSeconds": 1},
    }
    if parameters is not None:
        spec["parameters"] = parameters
    return {"apiVersion": api_names.API_VERSION, "kind": api_names.KIND,
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


def operator_job(name: str = "train", inject: str = "None", settings: Any = None,
                 **pod: Any) -> dict[str, Any]:
    """The Job the operator builds for a small ThrottledJob in namespace "ml" (keyword
    arguments override pod spec fields of its template), as it sends it."""
    from throttledjob.operator.children import build_child
    from throttledjob.operator.config import OperatorSettings
    from throttledjob.operator.validation import validate

    tj = make_tj(name, throttle={"targets": {"cpu": {"peak": "1500m"}}, "maxSlowdown": 1.25,
                                 "inject": inject}, **pod)
    job = build_child(tj, validate(tj), settings or OperatorSettings())
    job["metadata"]["namespace"] = tj["metadata"]["namespace"]
    return job


def tj_manifest(name: str, namespace: str, run_for: str = "2s", **kwargs: Any) -> dict:
    """A ThrottledJob whose pods KWOK runs for `run_for` before they succeed (they ask
    for KWOK's node, which is tainted: a pod that names no node goes to a real one)."""
    tj = make_tj(name, **{**ON_KWOK, **kwargs})
    tj["metadata"]["namespace"] = namespace
    template = tj["spec"]["jobTemplate"]["spec"]["template"]
    template.setdefault("metadata", {}).setdefault("annotations", {})[
        "throttledjob.io/test-run-for"] = run_for
    return tj
