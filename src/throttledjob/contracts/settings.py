"""The settings file (`settings.json` in the shared directory): the sidecar's decisions,
read by the workload.

One JSON object, versioned by `schema`, ordered by `seq`, stamped with `time` (Unix
seconds). The sidecar rewrites it every control interval, so its age is a heartbeat.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .names import SETTINGS_FILE

__all__ = ["SCHEMA_VERSION", "SETTINGS_FILE", "UNTHROTTLED", "Settings", "SettingsError",
           "parse_settings"]

SCHEMA_VERSION = 1


class SettingsError(ValueError):
    """The settings file exists but cannot be used."""


@dataclass(frozen=True)
class Settings:
    """What the workload should apply now. Every field's neutral value means 'no throttle'."""

    seq: int = 0
    time: float = 0.0
    # The CPU rate of the whole workload in cores, shared equally by the cooperating
    # processes (None: unlimited). On the wire as "quota", its name from before the word
    # was kept for the kernel's CFS quota alone; renaming it would break older runtimes.
    cpu_quota_cores: float | None = None
    # Upper bound on the fraction of wall time spent paused: 1 - 1/maxSlowdown.
    max_pause_fraction: float = 0.0
    # The sidecar is measuring a lever setting: hold the rate whatever it costs, and keep
    # the pauses off the budget's books (runtime/budget.py). A runtime that predates the
    # field keeps to max_pause_fraction, which is the budget's.
    probing: bool = False
    threads: int | None = None
    # Micro-batch size as a fraction of the user's default (gradient accumulation keeps the rest).
    batch_scale: float = 1.0
    rate_limit_per_second: float | None = None
    gpu_memory_fraction: float | None = None
    dataloader_workers: int | None = None
    params: dict[str, Any] = field(default_factory=dict)
    # How old the file may get before the writer is presumed dead.
    stale_after_seconds: float = 10.0

    @property
    def throttled(self) -> bool:
        return self != replace(UNTHROTTLED, seq=self.seq, time=self.time,
                               stale_after_seconds=self.stale_after_seconds)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA_VERSION, **asdict(self)}


UNTHROTTLED = Settings()


def parse_settings(obj: Any) -> Settings:
    """Validate a decoded settings object; raises SettingsError naming the bad field."""
    if not isinstance(obj, dict):
        raise SettingsError("settings must be a JSON object")
    if obj.get("schema") != SCHEMA_VERSION:
        raise SettingsError(f"unknown settings schema {obj.get('schema')!r}, "
                            f"expected {SCHEMA_VERSION}")
    s = Settings(
        seq=_number(obj, "seq", int, 0, None, 0),
        time=_number(obj, "time", float, 0.0, None, 0.0),
        cpu_quota_cores=_optional(obj, "cpu_quota_cores", float, 0.001, 4096.0),
        max_pause_fraction=_number(obj, "max_pause_fraction", float, 0.0, 0.99, 0.0),
        probing=_flag(obj, "probing"),
        threads=_optional(obj, "threads", int, 1, 4096),
        batch_scale=_number(obj, "batch_scale", float, 0.001, 1.0, 1.0),
        rate_limit_per_second=_optional(obj, "rate_limit_per_second", float, 1e-6, 1e9),
        gpu_memory_fraction=_optional(obj, "gpu_memory_fraction", float, 0.01, 1.0),
        dataloader_workers=_optional(obj, "dataloader_workers", int, 0, 1024),
        params=_params(obj.get("params", {})),
        stale_after_seconds=_number(obj, "stale_after_seconds", float, 0.1, 86400.0, 10.0),
    )
    return s


def _flag(obj: dict, key: str) -> bool:
    value = obj.get(key, False)
    if not isinstance(value, bool):
        raise SettingsError(f"settings field {key!r} must be true or false, got {value!r:.40}")
    return value


def _optional(obj: dict, key: str, kind: type, low: float, high: float) -> Any:
    return None if obj.get(key) is None else _number(obj, key, kind, low, high, None)


def _number(obj: dict, key: str, kind: type, low: float, high: float | None, default: Any) -> Any:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SettingsError(f"settings field {key!r} must be a number, got {value!r:.40}")
    # Finite first: int() of 1e400 (JSON reads it as inf) raised OverflowError, no ValueError.
    if not math.isfinite(value) or value < low or (high is not None and value > high):
        raise SettingsError(f"settings field {key!r}={value!r} is outside [{low}, {high}]")
    if kind is int and value != int(value):
        raise SettingsError(f"settings field {key!r} must be an integer, got {value!r}")
    return kind(value)


def _params(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or len(value) > 256:
        raise SettingsError("settings field 'params' must be an object of at most 256 entries")
    for k, v in value.items():
        if not isinstance(v, (int, float, str, bool)) or (isinstance(v, float)
                                                        and not math.isfinite(v)):
            raise SettingsError(f"settings field 'params': {str(k)[:40]!r} must be a finite "
                                "number, string or bool")
    return dict(value)
