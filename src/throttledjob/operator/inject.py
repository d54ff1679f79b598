"""`inject: Auto`: the runtime library in a pod with no change to the user's image. An
init container copies it into an emptyDir, and each workload container finds it first
on its PYTHONPATH, where its sitecustomize.py paces a PyTorch program at its steps."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from throttledjob.contracts.names import ENV_USER_PYTHONPATH

from .api_names import DEFAULT_INJECT, DEFAULT_SIDECAR_UID, INJECT_CONTAINER, INJECT_VOLUME
from .config import OperatorSettings

INJECT_DIR = "/opt/throttledjob/python"


def inject_mode(spec: Mapping[str, Any]) -> str:
    """`spec.throttle.inject` (Auto or None), defaulted as the CRD defaults it."""
    return str((spec.get("throttle") or {}).get("inject") or DEFAULT_INJECT)


def build_inject_container(settings: OperatorSettings) -> dict[str, Any]:
    """The init container that copies the runtime library and its sitecustomize.py into
    the `throttledjob-python` emptyDir (`throttledjob inject-lib DIR`, product image).

    It runs to completion before the workload starts, as a non-root UID with nothing
    but its own volume: the files it writes are world-readable, so any workload UID can
    import them, and it needs no privilege at all (Pod Security "restricted")."""
    return {
        "name": INJECT_CONTAINER,
        "image": settings.sidecar_image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["inject-lib", INJECT_DIR],
        # No .pyc files: the image's root filesystem is read-only here.
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                      "limits": {"memory": "64Mi"}},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": DEFAULT_SIDECAR_UID,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [{"name": INJECT_VOLUME, "mountPath": INJECT_DIR}],
    }


def inject_pythonpath(container: dict[str, Any]) -> None:
    """Put INJECT_DIR first on the container's PYTHONPATH, keeping the user's value.

    - `value` in `env`: prefixed in place.
    - `valueFrom` in `env` (a ConfigMap or Secret key): the entry is renamed
      THROTTLEDJOB_USER_PYTHONPATH, same source, same place, and a PYTHONPATH entry after
      it expands it: `INJECT_DIR:$(THROTTLEDJOB_USER_PYTHONPATH)` (the kubelet expands
      `$(VAR)` from entries defined before).
    - no entry, but `envFrom`: `INJECT_DIR:$(PYTHONPATH)`, which the kubelet expands from
      the envFrom sources (they are resolved before `env`); when none defines it, the
      literal `$(PYTHONPATH)` stays, a directory that does not exist, which Python skips.
    - neither: INJECT_DIR alone. A PYTHONPATH set only in the image (Dockerfile ENV) is
      invisible to Kubernetes and is overridden: repeat it in the template's env.
    """
    env = container.setdefault("env", [])
    for i, e in enumerate(env):
        if e.get("name") != "PYTHONPATH":
            continue
        if "valueFrom" in e:
            env[i] = {**e, "name": ENV_USER_PYTHONPATH}
            env.insert(i + 1, {"name": "PYTHONPATH",
                               "value": f"{INJECT_DIR}:$({ENV_USER_PYTHONPATH})"})
        else:
            user = e.get("value") or ""
            env[i] = {"name": "PYTHONPATH",
                      "value": f"{INJECT_DIR}:{user}" if user else INJECT_DIR}
        return
    value = f"{INJECT_DIR}:$(PYTHONPATH)" if container.get("envFrom") else INJECT_DIR
    env.append({"name": "PYTHONPATH", "value": value})


def add_runtime_library(pod: dict[str, Any], ours: list[dict[str, Any]],
                        volumes: list[dict[str, Any]], settings: OperatorSettings) -> None:
    """The init container after ours (the sidecar must start first), its volume, and
    each workload container's PYTHONPATH and read-only mount; the workload containers
    start only once it has completed."""
    ours.append(build_inject_container(settings))
    volumes.append({"name": INJECT_VOLUME,
                    "emptyDir": {"sizeLimit": settings.inject_dir_size_limit}})
    for c in pod["containers"]:
        inject_pythonpath(c)
        c["volumeMounts"].append({"name": INJECT_VOLUME, "mountPath": INJECT_DIR,
                                  "readOnly": True})
