"""The user's cluster path, as the README gives it: `make image` (the archive, on a base
built here: no registry), loaded into the real node's containerd as `kind load
image-archive` does, the chart installed with those image values, then every example of
examples/ applied (the image swapped for the one loaded) and held to the state its
`# expect:` line claims. A doc that drifts from what the product does fails here."""

from __future__ import annotations

import copy
import subprocess
import sys
from typing import Any

import pytest

from testing.cluster_cli import Kubectl, tj_status, wait_json
from testing.examples import Example, examples
from testing.paths import ROOT
from throttledjob.operator.conditions import condition
from tools import image

RUN_TIMEOUT = 240.0


@pytest.fixture(scope="module")
def loaded_image(real_node: Any) -> str:
    """`make image LOCAL_BASE=1`'s archive, loaded as kind loads one."""
    subprocess.run([sys.executable, "-m", "tools.image", "--local-base"], cwd=ROOT,
                   check=True, capture_output=True, timeout=1800)
    real_node.load(image.ARCHIVE)
    return image.IMAGE


def on_this_cluster(example: Example, image_name: str, namespace: str) -> dict[str, Any]:
    tj = copy.deepcopy(example.manifest)
    tj["metadata"]["namespace"] = namespace
    pod = tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    for c in pod["containers"]:
        c["image"], c["imagePullPolicy"] = image_name, "Never"
    return tj


@pytest.mark.parametrize("example", examples(), ids=lambda e: e.path.stem)
def test_each_example_reaches_the_state_it_claims(example: Example, loaded_image: str,
                                                  operator: str, kubectl: Kubectl) -> None:
    name = example.manifest["metadata"]["name"]
    kubectl.apply(on_this_cluster(example, loaded_image, operator))
    try:
        done = wait_json(kubectl, lambda tj: (tj.get("status") or {}).get("phase")
                         in ("Succeeded", "Failed"), "tj", "-n", operator, name,
                         what=f"{name} to finish", timeout=RUN_TIMEOUT)
        status = done["status"]
        assert status["phase"] == example.phase, status
        for type_, (want, reason) in example.conditions.items():
            got = condition(tj_status(kubectl, operator, name), type_) or {}
            assert got.get("status") == want, (type_, got, status.get("observed"))
            if reason:
                assert got.get("reason") == reason, (type_, got, status.get("observed"))
        observed = status.get("observed") or {}
        for key, op, bound in example.bounds:
            value = observed.get(key)
            assert value is not None and (value > bound if op == ">" else value < bound), \
                (key, op, bound, observed)
    finally:
        kubectl("delete", "tj", "-n", operator, name, "--wait=false", check=False)


def test_an_image_the_node_does_not_have_is_said_by_the_throttledjob(
        operator: str, kubectl: Kubectl) -> None:
    """The first thing that goes wrong on a user's own cluster: the image was never
    loaded. The ThrottledJob says which pod, container and image, with the kubelet's
    reason, and posts a warning, rather than leave a pod Pending with no word."""
    hello = next(e for e in examples() if e.path.stem == "hello")
    tj = on_this_cluster(hello, "localhost/never-loaded:dev", operator)
    tj["metadata"]["name"] = name = "not-loaded"
    kubectl.apply(tj)
    try:
        done = wait_json(kubectl, lambda t: condition(t.get("status") or {}, "PodsStarted"),
                         "tj", "-n", operator, name, what="PodsStarted", timeout=120)
        started = condition(done["status"], "PodsStarted")
        assert (started["status"], started["reason"]) == ("False", "ErrImageNeverPull")
        assert "/work: image localhost/never-loaded:dev" in started["message"]
        events = kubectl.json("get", "events", "-n", operator,
                              "--field-selector", f"involvedObject.name={name}")["items"]
        assert "PodCannotStart" in {e["reason"] for e in events}, events
    finally:
        kubectl("delete", "tj", "-n", operator, name, "--wait=false", check=False)
