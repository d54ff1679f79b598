"""Strict JSON schemas of the two Prometheus Operator resources the chart renders.

kubernetes-validate bundles only the core Kubernetes schemas, and the machines have no
route to the prometheus-operator CRDs, so these are written by hand from the
monitoring.coreos.com/v1 API reference (prometheus-operator.dev/docs/api-reference/api/),
covering the fields the chart uses, with their types and patterns, unknown fields refused.
A field the chart starts using must be added here, or the test fails.
"""

from __future__ import annotations

from typing import Any

# monitoring.coreos.com/v1 Duration and the Prometheus label name pattern.
DURATION = (r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
            r"(([0-9]+)s)?(([0-9]+)ms)?)$")
LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": props, "additionalProperties": False,
            "required": required or []}


STR = {"type": "string"}
STRMAP = {"type": "object", "additionalProperties": {"type": "string"}}
METADATA = _obj({"name": {"type": "string", "pattern": DNS_LABEL, "maxLength": 63},
                 "namespace": {"type": "string", "pattern": DNS_LABEL, "maxLength": 63},
                 "labels": STRMAP, "annotations": STRMAP}, ["name"])
LABEL_SELECTOR = _obj({
    "matchLabels": STRMAP,
    "matchExpressions": {"type": "array", "items": _obj({
        "key": STR, "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
        "values": {"type": "array", "items": STR}}, ["key", "operator"])},
})
RELABEL = _obj({
    "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": LABEL_NAME}},
    "separator": STR, "targetLabel": STR, "regex": STR, "modulus": {"type": "integer"},
    "replacement": STR,
    "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod",
                        "HashMod", "labelmap", "LabelMap", "labeldrop", "LabelDrop",
                        "labelkeep", "LabelKeep", "lowercase", "Lowercase", "uppercase",
                        "Uppercase", "keepequal", "KeepEqual", "dropequal", "DropEqual"]},
})

POD_MONITOR = _obj({
    "apiVersion": {"const": "monitoring.coreos.com/v1"},
    "kind": {"const": "PodMonitor"},
    "metadata": METADATA,
    "spec": _obj({
        "jobLabel": STR,
        "podTargetLabels": {"type": "array", "items": STR},
        "selector": LABEL_SELECTOR,
        # PodMonitorSpec: per-scrape limits (uint64).
        "sampleLimit": {"type": "integer", "minimum": 0},
        "labelLimit": {"type": "integer", "minimum": 0},
        "namespaceSelector": _obj({"any": {"type": "boolean"},
                                   "matchNames": {"type": "array", "items": STR}}),
        "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": _obj({
            "port": STR, "path": STR, "scheme": {"enum": ["http", "https"]},
            "interval": {"type": "string", "pattern": DURATION},
            "scrapeTimeout": {"type": "string", "pattern": DURATION},
            "honorLabels": {"type": "boolean"},
            "relabelings": {"type": "array", "items": RELABEL},
            "metricRelabelings": {"type": "array", "items": RELABEL},
        })},
    }, ["selector"]),
}, ["apiVersion", "kind", "metadata", "spec"])

PROMETHEUS_RULE = _obj({
    "apiVersion": {"const": "monitoring.coreos.com/v1"},
    "kind": {"const": "PrometheusRule"},
    "metadata": METADATA,
    "spec": _obj({"groups": {"type": "array", "items": _obj({
        "name": {"type": "string", "minLength": 1},
        "interval": {"type": "string", "pattern": DURATION},
        "labels": STRMAP,
        "rules": {"type": "array", "items": {
            **_obj({"alert": STR, "record": STR,
                    "expr": {"type": ["string", "integer"]},
                    "for": {"type": "string", "pattern": DURATION},
                    "keep_firing_for": {"type": "string", "pattern": DURATION},
                    "labels": STRMAP, "annotations": STRMAP}, ["expr"]),
            "oneOf": [{"required": ["alert"]}, {"required": ["record"]}]}},
    }, ["name"])}}),
}, ["apiVersion", "kind", "metadata", "spec"])

SCHEMAS = {"PodMonitor": POD_MONITOR, "PrometheusRule": PROMETHEUS_RULE}
