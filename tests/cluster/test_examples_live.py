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
from throttledjob.operator.status import condition
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
