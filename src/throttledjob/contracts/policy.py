"""The throttle policy: `spec.throttle` of a ThrottledJob, also read from `--policy FILE`.

One schema for the operator's ConfigMap, the sidecar and local mode. Field names are the
CRD's (camelCase); enum values are accepted in any case.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

# `Choice` is imported from here by other modules (contracts/status.py, the operator):
# the redundant alias keeps it exported.
from .choices import ENFORCEMENTS, HOLDS, MODES, PERMISSIONS, Enforcement, Hold, Mode, Permission
from .choices import Choice as Choice

MAX_POLICY_BYTES = 64 * 1024
# A hard target's pause budget: all but 1% of the time may be held back, the most the
# settings file carries (contracts/settings.py), so the budget never lifts the target.
HARD_MAX_PAUSE_FRACTION = 0.99


class PolicyError(ValueError):
    """A policy that cannot be used; the message names the offending field."""


@dataclass(frozen=True)
class Policy:
    cpu_peak_cores: float | None = None
    gpu_peak_utilization_percent: float | None = None
    gpu_peak_power_watts: float | None = None
    gpu_memory_fraction: float | None = None
    max_slowdown: float = 1.25
    hold: Hold = Hold.SOFT
    mode: Mode = Mode.ADAPTIVE
    enforcement: Enforcement = Enforcement.QUOTA
    interval_seconds: float = 1.0
    # Static cooperative levers (applied as they are, in both modes).
    threads: int | None = None
    batch_scale: float = 1.0
    rate_limit_per_second: float | None = None
    # Enforced without cooperation: niceness, and pinning to this many CPUs.
    nice: int | None = None
    cpu_affinity: int | None = None
    # The GPU board's power limit as a lever (privileged: sidecar/gpu_power_cap.py).
    gpu_power_limit: Permission = Permission.DENY
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Plain strings are accepted (the CLI's --enforcement, tests); the enum is stored.
        if self.mode in MODES:
            object.__setattr__(self, "mode", Mode(self.mode))
        if self.enforcement in ENFORCEMENTS:
            object.__setattr__(self, "enforcement", Enforcement(self.enforcement))
        if self.gpu_power_limit in PERMISSIONS:
            object.__setattr__(self, "gpu_power_limit", Permission(self.gpu_power_limit))
        if self.hold in HOLDS:
            object.__setattr__(self, "hold", Hold(self.hold))

    @property
    def uses_signals(self) -> bool:
        """May stop processes: with signals, or with a quota that falls back to them."""
        return self.enforcement in (Enforcement.SIGNALS, Enforcement.BOTH, Enforcement.QUOTA)

    @property
    def uses_pacing(self) -> bool:
        return self.enforcement in (Enforcement.COOPERATIVE, Enforcement.BOTH)

    @property
    def enforced_by_the_kernel(self) -> bool:
        return self.enforcement is Enforcement.QUOTA

    @property
    def allows_gpu_power_limit(self) -> bool:
        return self.gpu_power_limit is Permission.ALLOW

    @property
    def adaptive(self) -> bool:
        return self.mode is Mode.ADAPTIVE

    @property
    def hard(self) -> bool:
        return self.hold is Hold.HARD

    @property
    def budget_slowdown(self) -> float | None:
        """The slowdown the budget allows a target to cost; None: a hard target, never
        lifted whatever it costs."""
        return None if self.hard else self.max_slowdown

    @property
    def max_pause_fraction(self) -> float:
        """Pausing more than this fraction of wall time would exceed maxSlowdown; a hard
        target may pause all but the last 1%. Every lever's budget is read from here."""
        if self.hard:
            return HARD_MAX_PAUSE_FRACTION
        return 1.0 - 1.0 / self.max_slowdown

    def with_overrides(self, names: Mapping[str, str] | None = None,
                       **changes: Any) -> Policy:
        """A copy with the non-None `changes` applied and validated; an error names a
        changed field as `names` does (the command line's flags), else by its path."""
        given = {k: v for k, v in changes.items() if v is not None}
        return _validate(replace(self, **given),
                         {k: v for k, v in (names or {}).items() if k in given})


# Cores or millicores; also the CRD's grammar of targets.cpu.peak (operator/crd.py).
CPU_QUANTITY_PATTERN = r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(m?)$"
_CPU_QUANTITY = re.compile(CPU_QUANTITY_PATTERN)
CPU_MIN_CORES = 0.01  # 10m
CPU_MAX_CORES = 4096


@dataclass(frozen=True)
class PolicyField:
    """One field of the policy, as `spec.throttle` and a policy file spell it."""

    path: str  # camelCase, dotted: "levers.threads" is `threads` under `levers`
    attr: str  # the Policy attribute it sets
    # "number"; "integer" (a whole number); "choice" (one of `choices`, in any case);
    # "cpu" (a Kubernetes CPU quantity, as cores).
    type: str
    description: str  # the CRD's, for `kubectl explain`
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    # The CRD writes the Policy's default into the object, so that `kubectl get` shows
    # the value in force. Targets and levers stay absent unless set: absent is "none".
    crd_default: bool = False

    @property
    def group(self) -> str:
        """The dotted path of the mapping that holds it ("" at the top)."""
        return self.path.rpartition(".")[0]

    @property
    def key(self) -> str:
        return self.path.rpartition(".")[2]

    @property
    def default(self) -> Any:
        """The Policy's default, which an absent field leaves in force."""
        return Policy.__dataclass_fields__[self.attr].default

    @property
    def spelled_default(self) -> Any:
        """The default as the CRD writes it into an object (a choice capitalized)."""
        return self.default.capitalize() if self.type == "choice" else self.default


# The one list of the policy's fields: parse_policy reads by it, _validate bounds by it,
# and the CRD's schema of `spec.throttle` is generated from it (operator/crd.py).
POLICY_FIELDS: tuple[PolicyField, ...] = (
    PolicyField("targets.cpu.peak", "cpu_peak_cores", "cpu",
                'Peak CPU as a Kubernetes quantity: 1500m or "1.5" or 2.',
                CPU_MIN_CORES, CPU_MAX_CORES),
    PolicyField("targets.gpu.peakUtilizationPercent", "gpu_peak_utilization_percent", "number",
                "Peak GPU utilization, percent.", 1, 100),
    PolicyField("targets.gpu.peakPowerWatts", "gpu_peak_power_watts", "number",
                "Peak GPU board power, watts.", 1, 10000),
    PolicyField("targets.gpu.memoryFraction", "gpu_memory_fraction", "number",
                "Cap of the GPU memory each process may allocate, as a fraction.", 0.01, 1.0),
    PolicyField("targets.hold", "hold", "choice",
                "Soft: where holding a target would slow the workload past maxSlowdown, "
                "the budget wins and lifts the target (TargetMet False, BudgetExhausted). "
                "Hard: the targets hold whatever the slowdown (a power or thermal limit); "
                "maxSlowdown then only guides the choice of levers.",
                choices=HOLDS, crd_default=True),
    PolicyField("maxSlowdown", "max_slowdown", "number",
                "Never slow the workload by more than this factor of its unthrottled wall "
                "time (unless targets.hold is Hard); past it the status says the target is "
                "unreachable.",
                1.0, 100.0, crd_default=True),
    PolicyField("mode", "mode", "choice",
                "Adaptive trims by feedback; Fixed holds static settings.",
                choices=MODES, crd_default=True),
    PolicyField("enforcement", "enforcement", "choice",
                "Quota: the kernel's CPU quota holds the CPU target: the operator sets the "
                "workload containers' CPU limits from it (requests stay; a request over its "
                "share falls back to Both, with a QuotaUnavailable event). Cooperative: the "
                "runtime library paces the workload. Signals: the sidecar "
                "SIGSTOP/SIGCONT-cycles the workload's processes (shares the pod's process "
                "namespace). Both: pacing while the workload calls step(), signals otherwise.",
                choices=ENFORCEMENTS, crd_default=True),
    PolicyField("intervalSeconds", "interval_seconds", "number", "Control interval, seconds.",
                0.05, 3600.0, crd_default=True),
    PolicyField("levers.threads", "threads", "integer",
                "Cap of compute threads (torch, BLAS).", 1, 4096),
    PolicyField("levers.batchScale", "batch_scale", "number",
                "Fraction of the batch size to use.", 0.001, 1.0),
    PolicyField("levers.rateLimitPerSecond", "rate_limit_per_second", "number",
                "Most steps per second.", 1e-6, 1e9),
    # The two the sidecar sets on the workload's processes itself (sidecar/cpu/os_levers.py),
    # read when it starts: the agent keeps them for its life.
    PolicyField("levers.nice", "nice", "integer",
                "Niceness the sidecar gives the workload's processes (never lowered): "
                "neighbours win contended cores. Set when the sidecar starts; a later edit "
                "reaches new pods only.", 0, 19),
    PolicyField("levers.cpuAffinity", "cpu_affinity", "integer",
                "Pin the workload's processes to this many of the CPUs the sidecar may use "
                "(a hard cap of that many cores, whatever the program); given back when the "
                "sidecar stops. Set when the sidecar starts; a later edit reaches new pods "
                "only.", 1, 4096),
    PolicyField("levers.gpuPowerLimit", "gpu_power_limit", "choice",
                "Allow: a GPU power target is held first by capping each GPU's board power "
                "limit at it (within the board's range; put back when the workload ends), "
                "and by holding the workload back only for what the cap cannot hold. "
                "Privileged: the sidecar needs the right to set the limit (root on the "
                "node); where it cannot, it says so and holds back instead. Deny (absent): "
                "never touched.", choices=PERMISSIONS),
)


def parse_cpu_quantity(value: Any, name: str = "cpu peak") -> float:
    """Cores from a Kubernetes CPU quantity ("1500m", "1.5", 2)."""
    if isinstance(value, bool):
        raise PolicyError(f"{name}: expected a CPU quantity like 1500m or 1.5, got {value!r}")
    if isinstance(value, (int, float)):
        cores = float(value)
    else:
        m = _CPU_QUANTITY.match(str(value).strip())
        if not m:
            raise PolicyError(f"{name}: expected a CPU quantity like 1500m or 1.5, "
                              f"got {str(value)[:40]!r}")
        cores = float(m.group(1)) / (1000.0 if m.group(2) else 1.0)
    if not math.isfinite(cores) or cores < CPU_MIN_CORES or cores > CPU_MAX_CORES:
        raise PolicyError(f"{name}: {value!r} must be between {CPU_MIN_CORES * 1000:g}m and "
                          f"{CPU_MAX_CORES} cores")
    return cores


def parse_policy(doc: Any) -> Policy:
    """Build a Policy from a decoded `spec.throttle` mapping; raises PolicyError."""
    if doc is None:
        doc = {}
    groups = {"": _mapping(doc, "policy")}
    _known(doc, "policy", _children("") | {"parameters"})
    for path in _GROUPS:  # an absent (or empty) mapping is {}
        parent, _, key = path.rpartition(".")
        groups[path] = _mapping(groups[parent].get(key) or {}, path)
        _known(groups[path], path, _children(path))
    params = _mapping(doc.get("parameters") or {}, "parameters")
    values = {}
    for f in POLICY_FIELDS:
        value = _field_value(f, groups[f.group])
        if value is not _ABSENT:
            values[f.attr] = value
    return _validate(Policy(**values, params=_parameter_values(params)))


def load_policy_file(path: str) -> Policy:
    """Read a YAML policy file safely (no tags, bounded size); raises PolicyError."""
    import yaml  # the sidecar extra; the runtime library never needs it

    try:
        with open(path, "rb") as f:
            data = f.read(MAX_POLICY_BYTES + 1)
    except OSError as e:
        raise PolicyError(f"cannot read policy file {path}: {e.strerror}") from None
    if len(data) > MAX_POLICY_BYTES:
        raise PolicyError(f"policy file {path} is larger than {MAX_POLICY_BYTES} bytes")
    try:
        doc = yaml.safe_load(data)
    except (yaml.YAMLError, RecursionError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PolicyError(f"policy file {path} is not valid YAML: {first}") from None
    try:
        return parse_policy(doc)
    except PolicyError as e:
        raise PolicyError(f"policy file {path}: {e}") from None


def _validate(p: Policy, names: Mapping[str, str] | None = None) -> Policy:
    """`p` if every field is within the table's bounds; `names`: what to call a field in
    an error, by attribute (its path otherwise)."""
    names = names or {}
    numbers = [f for f in POLICY_FIELDS if f.type in ("number", "integer")]
    for f in numbers:
        value, name = getattr(p, f.attr), names.get(f.attr, f.path)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise PolicyError(f"{name} must be a finite number, got {value!r}")
        if not f.minimum <= value <= f.maximum:
            raise PolicyError(f"{name}={value} is out of range [{f.minimum}, {f.maximum}]")
        if f.type == "integer" and value != int(value):
            raise PolicyError(f"{name} must be a whole number, got {value}")
    for f in POLICY_FIELDS:
        if f.type == "choice" and getattr(p, f.attr) not in f.choices:
            raise PolicyError(f"{names.get(f.attr, f.path)} must be one of {f.choices}, "
                              f"got {getattr(p, f.attr)!r}")
    return p


def _parameter_values(params: dict) -> dict[str, Any]:
    """Live values of tunables: at most 256, named by short strings, finite scalars."""
    if len(params) > 256:
        raise PolicyError(f"parameters: at most 256 entries, got {len(params)}")
    for name, value in params.items():
        if not isinstance(name, str) or not 0 < len(name) <= 63:
            raise PolicyError(f"parameters: name {str(name)[:40]!r} must be 1-63 characters")
        if not isinstance(value, (bool, int, float, str)) or (
                isinstance(value, float) and not math.isfinite(value)) or (
                isinstance(value, str) and len(value) > 256):
            raise PolicyError(f"parameters.{name} must be a finite number, a bool or a short "
                              f"string, got {str(value)[:40]!r}")
    return dict(params)


def _mapping(value: Any, name: str) -> dict:
    if not isinstance(value, dict):
        raise PolicyError(f"{name} must be a mapping, got {type(value).__name__}")
    return value


def _known(doc: dict, name: str, allowed: set[str]) -> None:
    unknown = sorted(str(k) for k in doc if k not in allowed)
    if unknown:
        raise PolicyError(f"{name}: unknown field {unknown[0][:60]!r} "
                          f"(allowed: {', '.join(sorted(allowed))})")


# The mappings that hold the fields ("targets", "targets.cpu", ...), parents first.
_GROUPS = tuple(dict.fromkeys(
    ".".join(f.path.split(".")[:depth]) for f in POLICY_FIELDS
    for depth in range(1, f.path.count(".") + 1)))


def _children(group: str) -> set[str]:
    """The keys a mapping of the policy may hold: its fields and its sub-mappings."""
    prefix = f"{group}." if group else ""
    return {f.path[len(prefix):].split(".")[0] for f in POLICY_FIELDS
            if f.path.startswith(prefix)}


_ABSENT = object()  # a field not given: the Policy's default stays


def _field_value(f: PolicyField, group: dict) -> Any:
    """The value of `f` in its mapping, as the Policy holds it; bounds are _validate's."""
    if f.type == "choice":
        # Present means set: a null is refused, not read as the default.
        if f.key not in group:
            return _ABSENT
        value = group[f.key]
        if not isinstance(value, str) or value.lower() not in f.choices:
            raise PolicyError(f"{f.path} must be one of "
                              f"{', '.join(c.capitalize() for c in f.choices)}, "
                              f"got {str(value)[:40]!r}")
        return value.lower()
    value = group.get(f.key)
    if value is None:
        return _ABSENT
    if f.type == "cpu":
        return parse_cpu_quantity(value, f.path)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PolicyError(f"{f.path} must be a number, got {str(value)[:40]!r}")
    return value
