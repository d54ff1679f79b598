"""The ThrottledJob API's names and the spec's choices, which the pure modules, the
handlers, the CRD's schema (crd.py) and the tests share: its group, version and kind; the
containers and volumes the operator adds to a pod (a user's template must not use them);
the enums and bounds of the spec."""

from __future__ import annotations

from pathlib import Path

GROUP = "throttledjob.io"
VERSION = "v1alpha1"
PLURAL = "throttledjobs"
SINGULAR = "throttledjob"
KIND = "ThrottledJob"
SHORT_NAMES = ["tj"]
API_VERSION = f"{GROUP}/{VERSION}"
CRD_NAME = f"{PLURAL}.{GROUP}"
CRD_FILE = Path("charts/throttledjob/crds") / f"{GROUP}_{PLURAL}.yaml"

# Names the operator injects into the pod; a user's template must not use them.
SIDECAR_CONTAINER = "throttledjob-sidecar"
INJECT_CONTAINER = "throttledjob-inject"
GUARD_CONTAINER = "throttledjob-guard"
SHARED_VOLUME = "throttledjob-shared"
POLICY_VOLUME = "throttledjob-policy"
INJECT_VOLUME = "throttledjob-python"
NODE_AGENT_VOLUME = "throttledjob-node-agent"
RESERVED_CONTAINERS = (SIDECAR_CONTAINER, GUARD_CONTAINER, INJECT_CONTAINER)
INJECT_MODES = ["Auto", "None"]
# Opt-in: the init container and PYTHONPATH change every pod, and only Python programs
# that import torch gain anything (see docs/operator.md, "Zero-code injection").
DEFAULT_INJECT = "None"
SCOPES = ["Pod", "Job"]
DEFAULT_SCOPE = "Pod"
# The most pods a job-wide target is split among (scope Job).
MAX_RANKS = 64
# status.observed.gpus: a JobSet of 8 nodes of 8 GPUs; a GPU UUID is 40 characters.
MAX_GPUS = 64
MAX_UUID_LENGTH = 64
MAX_NAME_LENGTH = 63  # the Job is named after the ThrottledJob; Job names are label values
PHASES = ["Pending", "Queued", "Suspended", "Running", "Succeeded", "Failed"]
PARAMETER_TYPES = ["Integer", "Number", "Boolean", "String"]
# The sidecar image's non-root user, used when the workload's UID is unknown.
DEFAULT_SIDECAR_UID = 65532
