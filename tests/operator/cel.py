"""Run a CRD's x-kubernetes-validations (CEL) rules on a custom resource, as the API
server does: defaults applied first, numbers typed by the schema, every rule of every
present node evaluated. Uses cel-python (google-re2 regexes, as Kubernetes)."""

from __future__ import annotations

import copy
from typing import Any

import celpy

_ENV = celpy.Environment()
_PROGRAMS: dict[str, Any] = {}


def _program(rule: str) -> Any:
    if rule not in _PROGRAMS:
        _PROGRAMS[rule] = _ENV.program(_ENV.compile(rule))
    return _PROGRAMS[rule]


def apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """Structural defaulting: a missing property with a default gets it (recursively)."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, sub in props.items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(value[key], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in value:
                if key not in props:
                    value[key] = apply_defaults(value[key], extra)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(v, schema["items"]) for v in value]
    return value


def _typed(value: Any, schema: dict[str, Any]) -> Any:
    """JSON numbers in a `number` field are doubles in CEL, as in the API server."""
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value,
                                                                                     bool):
        return float(value)
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        return {k: _typed(v, props.get(k) or (extra if isinstance(extra, dict) else {}))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v, schema.get("items") or {}) for v in value]
    return value


def cel_errors(obj: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """Messages of the failed rules (and of rules that could not be evaluated)."""
    value = apply_defaults(copy.deepcopy(obj), schema)
    errors: list[str] = []
    _walk(_typed(value, schema), schema, "", errors)
    return errors


def _walk(value: Any, schema: dict[str, Any], path: str, errors: list[str]) -> None:
    for rule in schema.get("x-kubernetes-validations") or []:
        try:
            ok = _program(rule["rule"]).evaluate({"self": celpy.json_to_cel(value)})
        except celpy.CELEvalError as e:
            errors.append(f"{path}: rule {rule['rule']!r} failed to evaluate: {e.args[0]}")
            continue
        if not bool(ok):
            errors.append(f"{path}: {rule['message']}")
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, sub in value.items():
            sub_schema = props.get(key) or (extra if isinstance(extra, dict) else None)
            if sub_schema:
                _walk(sub, sub_schema, f"{path}.{key}", errors)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _walk(item, schema["items"], f"{path}[{i}]", errors)
