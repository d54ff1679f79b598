"""Objects checked as the API server would: the official Kubernetes schemas (1.30 and the
newest bundled) and the CRD's own schema under strict field validation."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import kubernetes_validate

from throttledjob.operator import crd

K8S_VERSIONS = ("1.30", kubernetes_validate.latest_version())


def k8s_validate(obj: dict[str, Any]) -> None:
    """Strict validation against the official schemas of Kubernetes 1.30 and the newest."""
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(copy.deepcopy(obj), version, strict=True)
        except kubernetes_validate.ValidationError as e:
            raise AssertionError(f"{obj.get('kind')} invalid for Kubernetes {version}: "
                                 f"{e.message} at {list(e.path)}") from None


def strict_schema(schema: Any) -> Any:
    """The CRD schema as the API server applies it with kubectl's strict field validation:
    unknown fields are refused (additionalProperties false) except where preserved.
    `nullable` becomes a JSON-schema type union."""
    if isinstance(schema, list):
        return [strict_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict_schema(v) for k, v in schema.items()
           if not k.startswith("x-kubernetes-") and k != "nullable"}
    if schema.get("nullable"):
        out["type"] = [schema["type"], "null"]
    if ("properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    if schema.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    return out


CR_SCHEMA = strict_schema(crd.openapi_schema())
# ObjectMeta is the API server's own schema, not the CRD's: its name's length is the
# CRD's to restrict, every other field stays.
CR_SCHEMA["properties"]["metadata"].pop("additionalProperties", None)
CR_VALIDATOR = jsonschema.Draft7Validator(CR_SCHEMA, format_checker=jsonschema.FormatChecker())


def cr_errors(obj: dict[str, Any]) -> list[str]:
    """Schema errors of a custom resource, as 'path: message' strings."""
    return [f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
            for e in CR_VALIDATOR.iter_errors(obj)]


def k8s_errors(obj: dict[str, Any]) -> list[str]:
    """kubernetes-validate --strict against Kubernetes 1.30 and the newest bundled."""
    out = []
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(copy.deepcopy(obj), version, strict=True)
        except kubernetes_validate.ValidationError as e:
            out.append(f"{obj['kind']}/{obj['metadata']['name']} invalid for {version}: "
                       f"{e.message} at {list(e.path)}")
    return out
