"""Zero-code injection (`spec.throttle.inject: Auto`): the init container, the volume, the
PYTHONPATH of every workload container (keeping the user's), and a pod started from what
the builder wrote actually loads the auto-hook."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from testing.builders import built, owned, pod_of, restricted_violations
from testing.manifests import make_tj
from testing.paths import VENV_BIN
from testing.validation import k8s_validate
from throttledjob.contracts.names import ENV_DIR, ENV_USER_PYTHONPATH
from throttledjob.contracts.policy import parse_policy
from throttledjob.operator import api_names, crd
from throttledjob.operator.children import SHARED_DIR
from throttledjob.operator.config import OperatorSettings
from throttledjob.operator.inject import INJECT_DIR
from throttledjob.operator.validation import SpecError, validate

INJECT = {"targets": {"cpu": {"peak": "1500m"}}, "inject": "Auto"}


def injected(**container: Any) -> dict[str, Any]:
    tj = make_tj(throttle=copy.deepcopy(INJECT))
    tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0].update(container)
    return tj


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "<from>") for e in container.get("env", [])}


def test_default_is_none_and_leaves_the_pod_alone() -> None:
    assert crd.throttle_schema()["properties"]["inject"]["default"] == "None"
    for throttle in ({"targets": {"cpu": {"peak": 1}}},
                     {"targets": {"cpu": {"peak": 1}}, "inject": "None"}):
        job, _ = built(make_tj(throttle=throttle))
        pod = pod_of(job)
        assert [c["name"] for c in pod["initContainers"]] == [api_names.SIDECAR_CONTAINER,
                                                              api_names.GUARD_CONTAINER]
        assert api_names.INJECT_VOLUME not in [v["name"] for v in pod["volumes"]]
        assert "PYTHONPATH" not in env_of(pod["containers"][0])


def test_auto_adds_init_container_volume_and_pythonpath() -> None:
    job, cm = built(injected())
    k8s_validate(job)  # --strict, Kubernetes 1.30 and the newest bundled
    pod = pod_of(job)
    init_names = [c["name"] for c in pod["initContainers"]]
    # The sidecar and its guard first
    assert init_names == [api_names.SIDECAR_CONTAINER, api_names.GUARD_CONTAINER,
                          api_names.INJECT_CONTAINER]
    init = pod["initContainers"][2]
    assert init["image"] == OperatorSettings().sidecar_image  # the product image
    assert init["args"] == ["inject-lib", INJECT_DIR]
    assert "restartPolicy" not in init  # runs to completion before the workload
    assert init["volumeMounts"] == [{"name": api_names.INJECT_VOLUME, "mountPath": INJECT_DIR}]
    sc = init["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert restricted_violations(pod) == []
    volume = next(v for v in pod["volumes"] if v["name"] == api_names.INJECT_VOLUME)
    assert volume == {"name": api_names.INJECT_VOLUME, "emptyDir": {"sizeLimit": "32Mi"}}
    (trainer,) = pod["containers"]
    assert env_of(trainer)["PYTHONPATH"] == INJECT_DIR
    assert env_of(trainer)[ENV_DIR] == SHARED_DIR  # the hook needs the shared dir too
    assert {"name": api_names.INJECT_VOLUME, "mountPath": INJECT_DIR, "readOnly": True} \
        in trainer["volumeMounts"]
    # The policy the sidecar reads has no `inject`: it is the operator's alone.
    doc = yaml.safe_load(cm["data"]["policy.yaml"])
    assert "inject" not in doc and parse_policy(doc).cpu_peak_cores == 1.5


def test_every_workload_container_gets_it_and_the_users_init_containers_do_not() -> None:
    tj = injected()
    pod = tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    pod["containers"].append({"name": "logger", "image": "busybox", "command": ["sh"]})
    pod["initContainers"] = [{"name": "fetch", "image": "busybox"}]
    job, _ = built(tj)
    out = pod_of(job)
    assert [c["name"] for c in out["initContainers"]] == [
        api_names.SIDECAR_CONTAINER, api_names.GUARD_CONTAINER, api_names.INJECT_CONTAINER, "fetch"]
    assert all(env_of(c)["PYTHONPATH"] == INJECT_DIR for c in out["containers"])
    assert "env" not in out["initContainers"][3]
    k8s_validate(job)


def test_a_users_pythonpath_value_is_kept_after_ours() -> None:
    job, _ = built(injected(env=[{"name": "A", "value": "1"},
                                 {"name": "PYTHONPATH", "value": "/app/src:/app/lib"},
                                 {"name": "B", "value": "$(PYTHONPATH)"}]))
    env = pod_of(job)["containers"][0]["env"]
    # Same place (B, which refers to it, still sees the full value), our directory first.
    assert env[:3] == [{"name": "A", "value": "1"},
                       {"name": "PYTHONPATH", "value": f"{INJECT_DIR}:/app/src:/app/lib"},
                       {"name": "B", "value": "$(PYTHONPATH)"}]
    assert [e["name"] for e in env].count("PYTHONPATH") == 1
    k8s_validate(job)


def test_a_pythonpath_from_a_configmap_is_renamed_and_expanded() -> None:
    source = {"configMapKeyRef": {"name": "paths", "key": "pythonpath"}}
    job, _ = built(injected(env=[{"name": "PYTHONPATH", "valueFrom": source}]))
    env = pod_of(job)["containers"][0]["env"]
    assert env[0] == {"name": ENV_USER_PYTHONPATH, "valueFrom": source}
    assert env[1] == {"name": "PYTHONPATH", "value": f"{INJECT_DIR}:$({ENV_USER_PYTHONPATH})"}
    assert [e["name"] for e in env].count("PYTHONPATH") == 1
    k8s_validate(job)


def test_a_pythonpath_from_envfrom_is_expanded() -> None:
    job, _ = built(injected(envFrom=[{"configMapRef": {"name": "settings"}}]))
    assert env_of(pod_of(job)["containers"][0])["PYTHONPATH"] == \
        f"{INJECT_DIR}:$(PYTHONPATH)"
    k8s_validate(job)


def test_the_off_switch_set_by_the_user_is_kept() -> None:
    job, _ = built(injected(env=[{"name": "THROTTLEDJOB_AUTOHOOK", "value": "0"}]))
    assert env_of(pod_of(job)["containers"][0])["THROTTLEDJOB_AUTOHOOK"] == "0"


@pytest.mark.parametrize(("tj", "reason"), [
    (injected(name=api_names.INJECT_CONTAINER), "NameClash"),
    (injected(volumeMounts=[{"name": "x", "mountPath": "/opt/throttledjob/python"}]),
     "MountPathClash"),
    (injected(env=[{"name": ENV_USER_PYTHONPATH, "value": "x"}]), "EnvClash"),
])
def test_names_the_injection_needs_are_refused(tj: dict[str, Any], reason: str) -> None:
    with pytest.raises(SpecError) as info:
        validate(owned(tj))
    assert info.value.reason == reason


def test_a_volume_named_like_ours_is_refused() -> None:
    tj = injected()
    tj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["volumes"] = [
        {"name": api_names.INJECT_VOLUME, "emptyDir": {}}]
    with pytest.raises(SpecError, match="reserved"):
        validate(owned(tj))


# --- the pod, played on this machine -----------------------------------------------------

def kubelet_env(container: dict[str, Any], configmap: dict[str, str]) -> dict[str, str]:
    """The environment the kubelet gives the container: envFrom first, then `env` in
    order with `$(VAR)` expanded from what is defined so far (literal when undefined).
    `configmap` is the one ConfigMap that envFrom and valueFrom refer to here."""
    env = dict(configmap) if container.get("envFrom") else {}

    def expand(value: str) -> str:
        return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                      lambda m: env.get(m.group(1), m.group(0)), value)

    for e in container.get("env", []):
        env[e["name"]] = (expand(e["value"]) if "value" in e
                          else configmap[e["valueFrom"]["configMapKeyRef"]["key"]])
    return env


PROBE = ("import sys, json, helper; "
         "print(json.dumps({'hook': 'throttledjob.runtime.autohook' in sys.modules, "
         "'watching': any(type(f).__name__ == '_TorchWatcher' for f in sys.meta_path), "
         "'helper': helper.VALUE}))")


@pytest.mark.parametrize(("container", "sources", "hook_on"), [
    ({"env": [{"name": "PYTHONPATH", "value": "{app}"}]}, {}, True),
    ({"env": [{"name": "PYTHONPATH", "valueFrom": {"configMapKeyRef": {
        "name": "p", "key": "k"}}}]}, {"k": "{app}"}, True),
    ({"envFrom": [{"configMapRef": {"name": "p"}}]}, {"PYTHONPATH": "{app}"}, True),
    ({"env": [{"name": "PYTHONPATH", "value": "{app}"},
              {"name": "THROTTLEDJOB_AUTOHOOK", "value": "0"}]}, {}, False),
], ids=["value", "valueFrom", "envFrom", "off-switch"])
def test_the_built_pod_loads_the_hook_and_keeps_the_users_path(
        tmp_path: Path, container: dict[str, Any], sources: dict[str, str],
        hook_on: bool) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "helper.py").write_text("VALUE = 'users module'\n")
    tj = injected(**yaml.safe_load(yaml.safe_dump(container).replace("{app}", str(app))))
    sources = {k: v.replace("{app}", str(app)) for k, v in sources.items()}
    job, _ = built(tj)
    pod = pod_of(job)
    # The init container, as the image runs it: `throttledjob inject-lib DIR`.
    lib = tmp_path / "python"
    (init,) = [c for c in pod["initContainers"] if c["name"] == api_names.INJECT_CONTAINER]
    done = subprocess.run([str(VENV_BIN / "throttledjob"), *init["args"][:1], str(lib)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (lib / "sitecustomize.py").is_file()
    # The workload container, its mounts mapped to this machine's directories.
    env = kubelet_env(pod["containers"][0], sources)
    env = {k: v.replace(INJECT_DIR, str(lib)).replace(SHARED_DIR, str(tmp_path))
           for k, v in env.items()}
    # A bare interpreter: no throttledjob installed, only what the pod has.
    base = {"PATH": os.environ.get("PATH", ""), "PYTHONNOUSERSITE": "1"}
    out = subprocess.run([sys._base_executable, "-c", PROBE], env={**base, **env},
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    result = yaml.safe_load(out.stdout)
    assert result["helper"] == "users module"  # the user's PYTHONPATH still works
    assert result["watching"] is hook_on
    assert "auto-hook" not in out.stderr  # no error from the hook
