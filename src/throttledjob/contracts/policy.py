"""The throttle policy: `spec.throttle` of a ThrottledJob, also read from `--policy FILE`.

One schema for the operator's ConfigMap, the sidecar and local mode. Field names are the
CRD's (camelCase); enum values are accepted in any case.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

MAX_POLICY_BYTES = 64 * 1024


class Choice(str, Enum):
    """A string choice that compares and prints as its value (StrEnum, on Python 3.10)."""

    def __str__(self) -> str:
        return self.value


class Mode(Choice):
    ADAPTIVE = "adaptive"  # the controller and explorer move the levers
    FIXED = "fixed"  # the levers stay as the policy sets them


class Enforcement(Choice):
    # The kernel's CPU quota (CFS bandwidth) on the workload's own cgroup holds the peak:
    # exact, no CPU of ours, nothing ever stopped; cooperative levers (threads, batch) are
    # still explored under it. Where no quota can be set, it falls back to BOTH (the
    # ladder, local and in a pod: sidecar/enforcement.py).
    QUOTA = "quota"
    COOPERATIVE = "cooperative"  # pacing by the runtime library at the workload's steps
    SIGNALS = "signals"  # SIGSTOP/SIGCONT duty cycling by the sidecar, for any program
    BOTH = "both"  # pacing while the workload calls step(), signals otherwise


MODES = tuple(m.value for m in Mode)
ENFORCEMENTS = tuple(e.value for e in Enforcement)


class PolicyError(ValueError):
    """A policy that cannot be used; the message names the offending field."""


@dataclass(frozen=True)
class Policy:
    cpu_peak_cores: float | None = None
    gpu_peak_utilization_percent: float | None = None
    gpu_peak_power_watts: float | None = None
    gpu_memory_fraction: float | None = None
    max_slowdown: float = 1.25
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
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Plain strings are accepted (the CLI's --enforcement, tests); the enum is stored.
        if self.mode in MODES:
            object.__setattr__(self, "mode", Mode(self.mode))
        if self.enforcement in ENFORCEMENTS:
            object.__setattr__(self, "enforcement", Enforcement(self.enforcement))

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
    def adaptive(self) -> bool:
        return self.mode is Mode.ADAPTIVE

    @property
    def max_pause_fraction(self) -> float:
        """Pausing more than this fraction of wall time would exceed maxSlowdown."""
        return 1.0 - 1.0 / self.max_slowdown

    def with_overrides(self, **changes: Any) -> Policy:
        """A copy with the non-None `changes` applied and validated."""
        merged = replace(self, **{k: v for k, v in changes.items() if v is not None})
        return _validate(merged)


_CPU_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(m?)$")


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
    if not math.isfinite(cores) or cores < 0.01 or cores > 4096:
        raise PolicyError(f"{name}: {value!r} must be between 10m and 4096 cores")
    return cores


def parse_policy(doc: Any) -> Policy:
    """Build a Policy from a decoded `spec.throttle` mapping; raises PolicyError."""
    if doc is None:
        doc = {}
    _mapping(doc, "policy")
    _known(doc, "policy", {"targets", "maxSlowdown", "mode", "enforcement", "intervalSeconds",
                           "levers", "parameters"})
    targets = _mapping(doc.get("targets") or {}, "targets")
    _known(targets, "targets", {"cpu", "gpu"})
    cpu = _mapping(targets.get("cpu") or {}, "targets.cpu")
    _known(cpu, "targets.cpu", {"peak"})
    gpu = _mapping(targets.get("gpu") or {}, "targets.gpu")
    _known(gpu, "targets.gpu", {"peakUtilizationPercent", "peakPowerWatts", "memoryFraction"})
    levers = _mapping(doc.get("levers") or {}, "levers")
    _known(levers, "levers", {"threads", "batchScale", "rateLimitPerSecond", "nice",
                              "cpuAffinity"})
    params = _mapping(doc.get("parameters") or {}, "parameters")
    policy = Policy(
        cpu_peak_cores=None if cpu.get("peak") is None
        else parse_cpu_quantity(cpu["peak"], "targets.cpu.peak"),
        gpu_peak_utilization_percent=_num(gpu, "peakUtilizationPercent"),
        gpu_peak_power_watts=_num(gpu, "peakPowerWatts"),
        gpu_memory_fraction=_num(gpu, "memoryFraction"),
        max_slowdown=_num(doc, "maxSlowdown", 1.25),
        mode=Mode(_enum(doc, "mode", MODES, Mode.ADAPTIVE)),
        enforcement=Enforcement(_enum(doc, "enforcement", ENFORCEMENTS, Enforcement.QUOTA)),
        interval_seconds=_num(doc, "intervalSeconds", 1.0),
        threads=_num(levers, "threads"),
        batch_scale=_num(levers, "batchScale", 1.0),
        rate_limit_per_second=_num(levers, "rateLimitPerSecond"),
        nice=_num(levers, "nice"),
        cpu_affinity=_num(levers, "cpuAffinity"),
        params=_parameter_values(params),
    )
    return _validate(policy)


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


_BOUNDS: dict[str, tuple[float, float]] = {
    "gpu_peak_utilization_percent": (1, 100),
    "gpu_peak_power_watts": (1, 10000),
    "gpu_memory_fraction": (0.01, 1.0),
    "max_slowdown": (1.0, 100.0),
    "interval_seconds": (0.05, 3600.0),
    "threads": (1, 4096),
    "batch_scale": (0.001, 1.0),
    "rate_limit_per_second": (1e-6, 1e9),
    "nice": (0, 19),
    "cpu_affinity": (1, 4096),
}
_CAMEL = {"gpu_peak_utilization_percent": "targets.gpu.peakUtilizationPercent",
          "gpu_peak_power_watts": "targets.gpu.peakPowerWatts",
          "gpu_memory_fraction": "targets.gpu.memoryFraction", "max_slowdown": "maxSlowdown",
          "interval_seconds": "intervalSeconds", "threads": "levers.threads",
          "batch_scale": "levers.batchScale", "rate_limit_per_second": "levers.rateLimitPerSecond",
          "nice": "levers.nice", "cpu_affinity": "levers.cpuAffinity"}


def _validate(p: Policy) -> Policy:
    for attr, (low, high) in _BOUNDS.items():
        value = getattr(p, attr)
        if value is None:
            continue
        name = _CAMEL[attr]
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise PolicyError(f"{name} must be a finite number, got {value!r}")
        if not low <= value <= high:
            raise PolicyError(f"{name}={value} is out of range [{low}, {high}]")
        if attr in ("threads", "nice", "cpu_affinity") and value != int(value):
            raise PolicyError(f"{name} must be a whole number, got {value}")
    if p.mode not in MODES:
        raise PolicyError(f"mode must be one of {MODES}, got {p.mode!r}")
    if p.enforcement not in ENFORCEMENTS:
        raise PolicyError(f"enforcement must be one of {ENFORCEMENTS}, got {p.enforcement!r}")
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


def _num(doc: dict, key: str, default: Any = None) -> Any:
    value = doc.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PolicyError(f"{key} must be a number, got {str(value)[:40]!r}")
    return value


def _enum(doc: dict, key: str, allowed: tuple[str, ...], default: str) -> str:
    value = doc.get(key, default)
    if not isinstance(value, str) or value.lower() not in allowed:
        raise PolicyError(f"{key} must be one of {', '.join(a.capitalize() for a in allowed)}, "
                          f"got {str(value)[:40]!r}")
    return value.lower()
