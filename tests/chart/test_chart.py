"""The Helm chart: lint, render, validate every object, refuse bad values, lock pods down."""

from __future__ import annotations

import json
import re
import shutil
import textwrap
from typing import Any

import jsonschema
import pytest
import yaml

from testing.chart import (
    ALL_ON,
    MONITORING_APIS,
    NAMESPACE,
    by_kind,
    helm,
    render,
    restricted_violations,
    template,
)
from testing.manifests import operator_job
from testing.monitoring_schemas import SCHEMAS
from testing.paths import CHART, ROOT
from testing.validation import k8s_errors
from throttledjob import __version__
from throttledjob.operator import children
from throttledjob.operator.api_names import SIDECAR_CONTAINER
from throttledjob.operator.config import OperatorSettings

CONFIGS = {
    "default": None,
    "all-optional-on": ALL_ON,
    "all-on, two namespaces": {**ALL_ON, "watchNamespaces": ["ml", "team-a"],
                               "networkPolicy": {"enabled": True}},
}
OPTIONAL_KINDS = {"PodMonitor", "PrometheusRule", "ConfigMap", "NetworkPolicy"}


def test_helm_lint_strict() -> None:
    # Lint renders in its lint mode, where the chart's `fail` on a kind the cluster does
    # not serve is logged, not fatal: the monitoring objects' configurations lint too.
    out = helm("lint", "--strict", str(CHART)).stdout
    assert "0 chart(s) failed" in out
    for name, values in CONFIGS.items():
        if values:
            args = [f"--set-json={key}={json.dumps(value)}" for key, value in values.items()]
            out = helm("lint", "--strict", str(CHART), *args).stdout
            assert "0 chart(s) failed" in out, name


def test_monitoring_objects_need_their_kinds_served(tmp_path) -> None:
    """Each of the Prometheus Operator's kinds is asked for by the object that needs it,
    in one line naming the value that turns it off: the rule alone on a cluster that
    serves PodMonitor only is refused for PrometheusRule."""
    rules_only = {"monitoring": {"prometheusRule": {"enabled": True}}}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules_only))
    missing_rule = helm("template", "tj", str(CHART), "-f", str(tmp_path / "rules.yaml"),
                        "--api-versions", "monitoring.coreos.com/v1/PodMonitor", check=False)
    assert missing_rule.returncode == 1
    assert "monitoring.prometheusRule.enabled=true needs the kind " \
        "monitoring.coreos.com/v1/PrometheusRule, which this cluster does not serve" \
        in missing_rule.stderr
    assert "or set monitoring.prometheusRule.enabled=false" in missing_rule.stderr
    assert "PrometheusRule" in {o["kind"] for o in render(rules_only, tmp_path)}
    assert template(None, tmp_path).returncode == 0  # off: nothing asked of the cluster


def test_chart_metadata_matches_the_package() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    # The image the operator injects by default is the one the chart runs.
    assert OperatorSettings().sidecar_image.endswith(f":{__version__}")


@pytest.mark.parametrize("config", list(CONFIGS))
def test_every_rendered_object_is_valid(config: str, tmp_path) -> None:
    objs = render(CONFIGS[config], tmp_path)
    kinds = sorted(o["kind"] for o in objs)
    assert {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"} <= set(kinds)
    errors = []
    for obj in objs:
        if obj["kind"] in SCHEMAS:  # not in kubernetes-validate: our strict schema
            v = jsonschema.Draft202012Validator(SCHEMAS[obj["kind"]])
            errors += [f"{obj['kind']}: {e.message} at {list(e.path)}"
                       for e in v.iter_errors(obj)]
        else:
            errors += k8s_errors(obj)
    assert errors == []
    if CONFIGS[config]:
        assert set(kinds) >= OPTIONAL_KINDS
    else:
        assert not OPTIONAL_KINDS & set(kinds)


def test_the_validators_catch_a_broken_object(tmp_path) -> None:
    """The checks above could fail: an unknown field and a bad PodMonitor are caught."""
    objs = render(ALL_ON, tmp_path)
    (deploy,) = by_kind(objs, "Deployment")
    deploy["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    assert k8s_errors(deploy)
    pm = sidecars_monitor(objs)
    pm["spec"]["podMetricsEndpoints"][0]["interval"] = "15 seconds"
    pm["spec"]["podMetricsEndpoints"][0]["prot"] = "metrics"
    assert len(list(jsonschema.Draft202012Validator(SCHEMAS["PodMonitor"]).iter_errors(pm))) == 2


def cr_errors(obj: dict[str, Any]) -> list[str]:
    """A ThrottledJob against the CRD's schema (OpenAPI part), unknown fields refused."""
    crd_doc = yaml.safe_load((CHART / "crds" / "throttledjob.io_throttledjobs.yaml").read_text())
    schema = crd_doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return [f"{e.message} at {list(e.path)}"
            for e in jsonschema.Draft202012Validator(schema).iter_errors(obj)]


def operator_pod(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (deploy,) = by_kind(objs, "Deployment")
    return deploy["spec"]["template"]["spec"]


@pytest.mark.parametrize("config", list(CONFIGS))
def test_operator_pod_meets_restricted(config: str, tmp_path) -> None:
    pod = operator_pod(render(CONFIGS[config], tmp_path))
    assert restricted_violations(pod) == []
    (c,) = pod["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    # Writable scratch only where mounted.
    assert [m["mountPath"] for m in c["volumeMounts"]] == ["/tmp"]


def test_the_restricted_check_sees_a_violation(tmp_path) -> None:
    # null deletes a default key in Helm's merge.
    values = {"securityContext": {"allowPrivilegeEscalation": True, "runAsNonRoot": None,
                                  "capabilities": {"drop": None, "add": ["SYS_ADMIN"]}},
              "podSecurityContext": {"runAsUser": 0, "runAsNonRoot": None,
                                     "seccompProfile": None}}
    found = restricted_violations(operator_pod(render(values, tmp_path)))
    assert {"operator: allowPrivilegeEscalation not false", "operator: capabilities added",
            "operator: capabilities not dropped", "operator: runAsNonRoot not true",
            "operator: seccompProfile", "operator: runAsUser 0"} <= set(found)


def test_operator_gets_its_flags_probes_and_sidecar_defaults(tmp_path) -> None:
    values = {"image": {"repository": "reg.example/tj", "tag": "1.2.3"},
              "sidecar": {"image": {"digest": "sha256:" + "a" * 64}, "cpuRequest": "100m",
                          "memoryLimit": "256Mi"},
              "operator": {"statusIntervalSeconds": 5, "verbose": True, "healthPort": 9090}}
    pod = operator_pod(render(values, tmp_path))
    (c,) = pod["containers"]
    assert c["image"] == "reg.example/tj:1.2.3"
    assert c["args"][:3] == ["operator", "--standalone", "--all-namespaces"]
    assert "--sidecar-image=reg.example/tj@sha256:" + "a" * 64 in c["args"]
    assert "--status-interval=5" in c["args"] and "--verbose" in c["args"]
    assert "--liveness=http://0.0.0.0:9090/healthz" in c["args"]
    env = {e["name"]: e["value"] for e in c["env"]}
    # The names the operator reads (operator/config.py, OperatorSettings.from_env).
    settings = OperatorSettings.from_env(env)
    assert settings.sidecar_cpu_request == "100m"
    assert settings.sidecar_memory_limit == "256Mi"
    assert settings.sidecar_memory_request == "64Mi"
    assert settings.shared_dir_size_limit == "16Mi"
    assert settings.status_timeout_seconds == 2.0
    assert settings.scrape_annotations  # no PodMonitor: the annotations are the way in
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["ports"] == [{"name": "health", "containerPort": 9090, "protocol": "TCP"},
                          {"name": "metrics", "containerPort": 8081, "protocol": "TCP"}]
    assert "--metrics-port=8081" in c["args"]


def test_operator_flags_are_ones_the_cli_accepts(tmp_path) -> None:
    """Every flag the chart passes is parsed by the real `throttledjob operator`."""
    from throttledjob import cli

    (c,) = operator_pod(render({"watchNamespaces": ["ml", "team-a"],
                                "operator": {"debug": True}}, tmp_path))["containers"]
    args = cli.build_parser().parse_args(c["args"])
    assert args.namespace == ["ml", "team-a"] and not args.all_namespaces
    assert args.standalone and args.debug
    assert args.sidecar_image == f"ghcr.io/throttledjob/throttledjob:{__version__}"
    assert args.liveness == "http://0.0.0.0:8080/healthz" and args.metrics_port == 8081


def test_sidecar_image_defaults_to_the_operator_image(tmp_path) -> None:
    (c,) = operator_pod(render({"image": {"tag": "9.9.9"}}, tmp_path))["containers"]
    assert c["image"] == "ghcr.io/throttledjob/throttledjob:9.9.9"
    assert "--sidecar-image=ghcr.io/throttledjob/throttledjob:9.9.9" in c["args"]


def test_optional_parts_take_their_namespace_and_labels(tmp_path) -> None:
    values = {"monitoring": {
        "podMonitor": {"enabled": True, "namespace": "monitoring",
                       "labels": {"release": "kps"}},
        "prometheusRule": {"enabled": True, "namespace": "monitoring",
                           "labels": {"release": "kps"}},
        "dashboard": {"enabled": True, "namespace": "grafana", "sidecarLabel": "dash",
                      "sidecarLabelValue": "yes", "annotations": {"grafana_folder": "Batch"}}},
        "watchNamespaces": ["ml"]}
    objs = render(values, tmp_path)
    pm, op_pm = by_kind(objs, "PodMonitor")
    # The operator's own: its pod, on its metrics port.
    assert selects(op_pm["spec"]["selector"], operator_pod_labels(objs))
    (port,) = [p for p in by_kind(objs, "Deployment")[0]["spec"]["template"]["spec"][
        "containers"][0]["ports"] if p["name"] == "metrics"]
    assert op_pm["spec"]["podMetricsEndpoints"][0]["port"] == port["name"]
    assert op_pm["metadata"]["namespace"] == "monitoring"
    # The PodMonitor scrapes the sidecars: no prometheus.io annotation asks for a second.
    env = {e["name"]: e["value"] for e in operator_pod(objs)["containers"][0]["env"]}
    assert not OperatorSettings.from_env(env).scrape_annotations
    (rule,) = by_kind(objs, "PrometheusRule")
    (cm,) = by_kind(objs, "ConfigMap")
    assert pm["metadata"]["namespace"] == rule["metadata"]["namespace"] == "monitoring"
    assert pm["metadata"]["labels"]["release"] == rule["metadata"]["labels"]["release"] == "kps"
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["ml"]}
    # The PodMonitor selects exactly the pods the operator builds, on their metrics port.
    assert pm["spec"]["selector"]["matchLabels"] == {
        children.LABEL_MANAGED_BY: children.MANAGED_BY}
    assert pm["spec"]["selector"]["matchExpressions"] == [
        {"key": children.LABEL_NAME, "operator": "Exists"}]
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == children.METRICS_PORT_NAME
    relabelings = pm["spec"]["podMetricsEndpoints"][0]["relabelings"]
    # Only the sidecar's port of that name: a workload container may have its own.
    assert relabelings[0] == {"sourceLabels": ["__meta_kubernetes_pod_container_name"],
                              "regex": SIDECAR_CONTAINER, "action": "keep"}
    (relabel,) = [r for r in relabelings if r.get("targetLabel") == "throttledjob"]
    assert relabel["sourceLabels"] == ["__meta_kubernetes_pod_label_" + re.sub(
        r"[^a-zA-Z0-9_]", "_", children.LABEL_NAME)]
    assert relabel["targetLabel"] == "throttledjob"  # what the dashboard and alerts use
    assert cm["metadata"]["namespace"] == "grafana"
    assert cm["metadata"]["labels"]["dash"] == "yes"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Batch"}
    (key,) = cm["data"]
    assert json.loads(cm["data"][key])["uid"] == "throttledjob-overview"


def sidecars_monitor(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (pm,) = [o for o in by_kind(objs, "PodMonitor") if o["metadata"]["name"].endswith("-sidecars")]
    return pm


def test_cluster_wide_podmonitor_watches_every_namespace(tmp_path) -> None:
    pm = sidecars_monitor(render(ALL_ON, tmp_path))
    assert pm["spec"]["namespaceSelector"] == {"any": True}


def test_the_node_agents_are_scraped_where_they_run_and_nothing_else_reaches_them(
        tmp_path) -> None:
    objs = render(ALL_ON, tmp_path)
    (ds,) = by_kind(objs, "DaemonSet")
    labels = ds["spec"]["template"]["metadata"]["labels"]
    (agents,) = [o for o in by_kind(objs, "PodMonitor")
                 if o["metadata"]["name"].endswith("-node-agents")]
    assert agents["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (port,) = ds["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert agents["spec"]["podMetricsEndpoints"][0]["port"] == port["name"] == "metrics"
    # Their namespace and pod labels name the GPU's pod, not the agent's (dcgm-exporter's
    # convention): kept, not renamed exported_pod.
    assert agents["spec"]["podMetricsEndpoints"][0]["honorLabels"] is True
    (policy,) = [o for o in by_kind(objs, "NetworkPolicy")
                 if o["metadata"]["name"].endswith("-node-agent")]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    # Prometheus alone (networkPolicy.prometheus): not every pod of the cluster.
    assert policy["spec"]["ingress"] == [
        {"from": [{"namespaceSelector": {"matchLabels": {
                       "kubernetes.io/metadata.name": "monitoring"}},
                   "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}],
         "ports": [{"protocol": "TCP", "port": port["containerPort"]}]}]
    # The operator's Deployment does not select the agents' pods.
    (deploy,) = by_kind(objs, "Deployment")
    assert not deploy["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_notes_tell_the_user_what_to_do_next(tmp_path) -> None:
    # `helm template` does not print NOTES.txt and `helm install --dry-run` needs a cluster:
    # render the notes through tpl in a copy of the chart.
    chart_copy = tmp_path / "chart"
    shutil.copytree(CHART, chart_copy)
    shutil.copy(CHART / "templates" / "NOTES.txt", chart_copy / "notes.txt")
    (chart_copy / "templates" / "notes-as-configmap.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n'
        'data:\n  notes: {{ tpl (.Files.Get "notes.txt") . | quote }}\n')
    for values, expect in ((None, ["every namespace", "kubectl get tj", "rollout status",
                                   "monitoring.dashboard.enabled=true"]),
                           ({**ALL_ON, "watchNamespaces": ["ml"]},
                            ["namespaces: ml", "kubectl apply -n ml", "throttledjob-overview",
                             "grafana/tj-throttledjob-dashboard", "PrometheusRule"])):
        path = tmp_path / "v.yaml"
        path.write_text(yaml.safe_dump(values or {}))
        out = helm("template", "tj", str(chart_copy), "-n", NAMESPACE, *MONITORING_APIS,
                   "-f", str(path),
                   "--show-only", "templates/notes-as-configmap.yaml").stdout
        text = yaml.safe_load(out)["data"]["notes"]
        for phrase in expect:
            assert phrase in text, phrase
        # The example ThrottledJob in the notes is a valid one.
        example = yaml.safe_load(textwrap.dedent(
            text.split("<<'YAML'\n")[1].split("   YAML\n")[0]))
        assert example["kind"] == "ThrottledJob"
        assert cr_errors(example) == []
        # The one the suite runs (tests/cluster/test_examples_live.py).
        assert example == yaml.safe_load((ROOT / "examples" / "hello.yaml").read_text())


# --- values.schema.json ------------------------------------------------------------------

BAD_VALUES = [
    ({"unknownKey": 1}, "unknownKey"),
    ({"image": {"tag": 5}}, "image.tag"),
    ({"image": {"repository": ""}}, "image.repository"),
    ({"image": {"pullPolicy": "Sometimes"}}, "image.pullPolicy"),
    ({"image": {"digest": "latest"}}, "image.digest"),
    ({"image": {"registry": "x"}}, "registry"),
    ({"watchNamespaces": "ml"}, "watchNamespaces"),
    ({"watchNamespaces": ["Not_A_Namespace"]}, "watchNamespaces"),
    ({"watchNamespaces": ["ml", "ml"]}, "watchNamespaces"),
    ({"operator": {"statusIntervalSeconds": 0}}, "statusIntervalSeconds"),
    ({"operator": {"statusIntervalSeconds": "10"}}, "statusIntervalSeconds"),
    ({"operator": {"statusTimeoutSeconds": -1}}, "statusTimeoutSeconds"),
    ({"operator": {"healthPort": 80}}, "healthPort"),
    ({"operator": {"healthPort": 8080.5}}, "healthPort"),
    ({"operator": {"verbose": "yes"}}, "verbose"),
    ({"sidecar": {"cpuRequest": "fast"}}, "cpuRequest"),
    ({"sidecar": {"memoryLimit": 128}}, "memoryLimit"),
    ({"sidecar": {"sharedDirSizeLimit": "16 MB"}}, "sharedDirSizeLimit"),
    ({"sidecar": {"image": {"digest": "sha256:short"}}}, "digest"),
    ({"sidecar": {"cpuLimit": "1"}}, "cpuLimit"),
    ({"serviceAccount": {"create": "true"}}, "create"),
    ({"serviceAccount": {"name": "Bad Name"}}, "serviceAccount.name"),
    ({"rbac": {"create": 1}}, "rbac.create"),
    ({"resources": {"request": {"cpu": "1"}}}, "request"),
    ({"resources": {"limits": {"memory": 256}}}, "limits.memory"),
    ({"podLabels": {"team": 1}}, "podLabels.team"),
    ({"tolerations": {"key": "x"}}, "tolerations"),
    ({"monitoring": {"podMonitor": {"enabled": "true"}}}, "enabled"),
    ({"monitoring": {"podMonitor": {"interval": "15"}}}, "interval"),
    ({"monitoring": {"podMonitor": {"namespace": "Monitoring"}}}, "namespace"),
    ({"monitoring": {"prometheusRule": {"labels": ["release"]}}}, "labels"),
    ({"monitoring": {"dashboard": {"sidecarLabel": ""}}}, "sidecarLabel"),
    ({"monitoring": {"dashboard": {"sidecarLabelValue": 1}}}, "sidecarLabelValue"),
    ({"monitoring": {"serviceMonitor": {"enabled": True}}}, "serviceMonitor"),
    ({"networkPolicy": {"enabled": "true"}}, "networkPolicy.enabled"),
    ({"networkPolicy": {"namespaces": "ml"}}, "namespaces"),
    ({"networkPolicy": {"namespaces": ["ML"]}}, "namespaces"),
    ({"networkPolicy": {"metricsPort": 0}}, "metricsPort"),
    ({"networkPolicy": {"metricsPort": 65536}}, "metricsPort"),
    ({"networkPolicy": {"metricsPort": "9400"}}, "metricsPort"),
    ({"networkPolicy": {"allowOtherPorts": "no"}}, "allowOtherPorts"),
    ({"networkPolicy": {"prometheus": {"podSelector": {"matchLabel": {"a": "b"}}}}},
     "matchLabel"),
    ({"networkPolicy": {"prometheus": {"podSelector": {"matchLabels": {"a": 1}}}}},
     "matchLabels.a"),
    ({"networkPolicy": {"prometheus": {"namespaceSelector": {"matchExpressions": [
        {"key": "a", "operator": "Equals"}]}}}}, "operator"),
    ({"networkPolicy": {"prometheus": {"namespaceSelector": {"matchExpressions": [
        {"operator": "Exists"}]}}}}, "key"),
    ({"networkPolicy": {"nodeCIDRs": ["10.0.0.0"]}}, "nodeCIDRs"),
    ({"networkPolicy": {"nodeCIDRs": "10.0.0.0/8"}}, "nodeCIDRs"),
    ({"networkPolicy": {"egress": []}}, "egress"),
]


@pytest.mark.parametrize(("values", "field"), BAD_VALUES,
                         ids=[f"{i}-{f}" for i, (_, f) in enumerate(BAD_VALUES)])
def test_schema_refuses_bad_values(values: dict[str, Any], field: str, tmp_path) -> None:
    proc = template(values, tmp_path)
    assert proc.returncode != 0, f"accepted {values}"
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    leaf = field.split(".")[-1]
    assert leaf in proc.stderr or field in proc.stderr, proc.stderr


def test_schema_describes_every_key_and_refuses_unknown_ones() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(node: dict[str, Any], path: str) -> None:
        assert node.get("description") or path == "", f"{path}: no description"
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, f"{path}: open object"
            for key, child in node["properties"].items():
                walk(child, f"{path}.{key}" if path else key)

    walk(schema, "")
    # Every key of values.yaml is in the schema, and has a comment right above it.
    values_text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(values_text)

    def keys(d: dict[str, Any], s: dict[str, Any], path: str) -> None:
        for k, v in d.items():
            assert k in s.get("properties", {}), f"{path}{k} not in the schema"
            if isinstance(v, dict) and s["properties"][k].get("additionalProperties") is False:
                keys(v, s["properties"][k], f"{path}{k}.")

    keys(values, schema, "")
    # Every chart key (one the schema describes) has a comment on the line above it;
    # keys inside free-form Kubernetes objects (resources, securityContext) are exempt.
    lines = values_text.splitlines()
    stack: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z]\w*):", line)
        if not m:
            continue
        indent = len(m.group(1))
        stack = [(n, k) for n, k in stack if n < indent] + [(indent, m.group(2))]
        node: dict[str, Any] | None = schema
        for _, k in stack:
            node = (node or {}).get("properties", {}).get(k)
        if node is not None:
            assert lines[i - 1].strip().startswith("#"), f"values.yaml:{i + 1}: {line}"


def test_default_values_render_without_overrides() -> None:
    """The values file passes its own schema (helm checks it on every render)."""
    helm("template", "tj", str(CHART))


# --- networkPolicy -----------------------------------------------------------------------

PROTOCOLS = ("TCP", "UDP", "SCTP")
ALL_PORTS = frozenset(range(1, 65536))
ANYONE = "anyone"


def covered_ports(rule: dict[str, Any], protocol: str) -> frozenset[int]:
    """The ports of `protocol` an ingress rule allows, as NetworkPolicy defines them: no
    `ports` means all; an entry without `port` means all of its protocol (default TCP)."""
    if not rule.get("ports"):
        return ALL_PORTS
    out: set[int] = set()
    for p in rule["ports"]:
        if p.get("protocol", "TCP") != protocol:
            continue
        if "port" not in p:
            return ALL_PORTS
        assert isinstance(p["port"], int), p  # a named port would match only containers'
        out |= set(range(p["port"], p.get("endPort", p["port"]) + 1))
    return frozenset(out)


def reachable(policy: dict[str, Any], protocol: str) -> dict[int, Any]:
    """Port -> ANYONE, or the list of peers allowed to it; ports absent are closed."""
    out: dict[int, Any] = {}
    for rule in policy["spec"]["ingress"]:
        for port in covered_ports(rule, protocol):
            if not rule.get("from") or out.get(port) == ANYONE:
                out[port] = ANYONE
            else:
                out.setdefault(port, []).extend(rule["from"])
    return out


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) against a set of labels."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        ok = {"In": lambda e: labels.get(e["key"]) in e["values"],
              "NotIn": lambda e: labels.get(e["key"]) not in e["values"],
              "Exists": lambda e: e["key"] in labels,
              "DoesNotExist": lambda e: e["key"] not in labels}[e["operator"]](e)
        if not ok:
            return False
    return True


def sidecar_policies(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in by_kind(objs, "NetworkPolicy")
            if o["metadata"]["name"].endswith("-sidecar-metrics")]


def test_network_policy_is_off_by_default(tmp_path) -> None:
    assert by_kind(render(None), "NetworkPolicy") == []
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["networkPolicy"]["enabled"] is False
    # The default port is the one the operator gives the sidecar's `metrics` port.
    assert values["networkPolicy"]["metricsPort"] == children.METRICS_PORT


def test_network_policy_goes_where_the_throttledjobs_are(tmp_path) -> None:
    # A NetworkPolicy is namespaced: with the operator watching every namespace, the
    # namespaces must be listed, or the render fails and says so.
    proc = template({"networkPolicy": {"enabled": True}}, tmp_path)
    assert proc.returncode != 0 and "networkPolicy.namespaces" in proc.stderr, proc.stderr
    objs = render({"networkPolicy": {"enabled": True}, "watchNamespaces": ["ml", "team-a"]},
                  tmp_path)
    assert [p["metadata"]["namespace"] for p in sidecar_policies(objs)] == ["ml", "team-a"]
    objs = render({"networkPolicy": {"enabled": True, "namespaces": ["batch"]},
                   "watchNamespaces": ["ml", "team-a"]}, tmp_path)
    assert [p["metadata"]["namespace"] for p in sidecar_policies(objs)] == ["batch"]
    # The operator's own pod: its health port from anyone (the kubelet), its metrics port
    # from Prometheus.
    (op,) = [o for o in by_kind(objs, "NetworkPolicy") if o not in sidecar_policies(objs)]
    assert op["metadata"]["namespace"] == NAMESPACE
    assert selects(op["spec"]["podSelector"],
                   operator_pod_labels(objs)) and op["spec"]["policyTypes"] == ["Ingress"]
    open_tcp = reachable(op, "TCP")
    values = yaml.safe_load((CHART / "values.yaml").read_text())["networkPolicy"]
    assert open_tcp == {8080: ANYONE, 8081: [{
        "namespaceSelector": values["prometheus"]["namespaceSelector"],
        "podSelector": values["prometheus"]["podSelector"]}]}
    assert reachable(op, "UDP") == reachable(op, "SCTP") == {}


def operator_pod_labels(objs: list[dict[str, Any]]) -> dict[str, str]:
    (deploy,) = by_kind(objs, "Deployment")
    return deploy["spec"]["template"]["metadata"]["labels"]


def assert_only_peers_reach_the_metrics_port(policy: dict[str, Any], port: int,
                                             objs: list[dict[str, Any]],
                                             extra_peers: list[dict[str, Any]]) -> None:
    """Every port but `port` open to anyone, for TCP, UDP and SCTP; `port` reachable over
    TCP from Prometheus, the operator and `extra_peers` only, and not over UDP or SCTP."""
    for protocol in PROTOCOLS:
        reach = reachable(policy, protocol)
        assert {p for p, who in reach.items() if who == ANYONE} == ALL_PORTS - {port}, protocol
        if protocol != "TCP":
            assert port not in reach, protocol
    peers = reachable(policy, "TCP")[port]
    assert peers != ANYONE
    values = yaml.safe_load((CHART / "values.yaml").read_text())["networkPolicy"]
    prometheus = {"namespaceSelector": values["prometheus"]["namespaceSelector"],
                  "podSelector": values["prometheus"]["podSelector"]}
    operator = {"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": NAMESPACE}},
        "podSelector": {"matchLabels": {k: v for k, v in operator_pod_labels(objs).items()
                                        if k != "app.kubernetes.io/component"}}}
    assert peers == [prometheus, operator, *extra_peers]
    # The operator peer selects the operator's pod (in the release namespace's label).
    assert selects(peers[1]["podSelector"], operator_pod_labels(objs))
    assert selects(peers[1]["namespaceSelector"],
                   {"kubernetes.io/metadata.name": NAMESPACE})


def test_network_policy_leaves_every_port_open_but_the_metrics_one(tmp_path) -> None:
    objs = render({"networkPolicy": {"enabled": True, "namespaces": ["ml"]}}, tmp_path)
    (policy,) = sidecar_policies(objs)
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress untouched
    # It selects exactly the pods the operator builds, not the operator's own.
    job = operator_job(inject="Auto")
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert selects(policy["spec"]["podSelector"], pod_labels)
    assert not selects(policy["spec"]["podSelector"], operator_pod_labels(objs))
    assert not selects(policy["spec"]["podSelector"], {"team": "vision"})
    # ... and guards the port the built sidecar serves on.
    (port,) = [p["containerPort"] for c in job["spec"]["template"]["spec"]["initContainers"]
               for p in c.get("ports") or [] if p["name"] == children.METRICS_PORT_NAME]
    assert_only_peers_reach_the_metrics_port(policy, port, objs, [])
    assert k8s_errors(policy) == []


@pytest.mark.parametrize("port", [8000, 1, 65535])
def test_network_policy_ranges_follow_the_metrics_port(port: int, tmp_path) -> None:
    values = {"networkPolicy": {"enabled": True, "namespaces": ["ml"], "metricsPort": port,
                                "nodeCIDRs": ["10.0.0.0/16", "fd00::/64"]}}
    objs = render(values, tmp_path)
    (policy,) = sidecar_policies(objs)
    assert_only_peers_reach_the_metrics_port(
        policy, port, objs, [{"ipBlock": {"cidr": "10.0.0.0/16"}},
                             {"ipBlock": {"cidr": "fd00::/64"}}])
    assert k8s_errors(policy) == []


def test_network_policy_can_leave_other_ports_to_the_namespace(tmp_path) -> None:
    """allowOtherPorts=false: only the metrics rule (policies add up, so the open-ports
    rule would undo a namespace's own default-deny); a wider Prometheus selector."""
    values = {"networkPolicy": {"enabled": True, "namespaces": ["ml"], "allowOtherPorts": False,
                                "prometheus": {"namespaceSelector": {"matchLabels": None},
                                               "podSelector": {"matchLabels": {
                                                   "app": "prometheus"}}}}}
    objs = render(values, tmp_path)
    (policy,) = sidecar_policies(objs)
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": children.METRICS_PORT}]
    assert rule["from"][0] == {"namespaceSelector": {},
                               "podSelector": {"matchLabels": {"app.kubernetes.io/name":
                                                               "prometheus",
                                                               "app": "prometheus"}}}
    assert k8s_errors(policy) == []


def test_the_attach_webhook_fails_open_and_sees_only_new_unthrottled_pods(tmp_path) -> None:
    """attach.enabled: the configuration calls the Service, which reaches the port the
    operator serves on (its env, read as the operator reads it); failurePolicy Ignore;
    never kube-system or the release's namespace, never a pod with the throttle; the
    certificate's names are the Service's, and its CA goes into this configuration."""
    objs = render({"attach": {"enabled": True, "namespaceSelector": {
        "matchLabels": {"throttledjob.io/attach": "enabled"}}}}, tmp_path)
    (mwc,) = by_kind(objs, "MutatingWebhookConfiguration")
    (hook,) = mwc["webhooks"]
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
    (rule,) = hook["rules"]
    assert rule["operations"] == ["CREATE"] and rule["resources"] == ["pods"]
    assert hook["namespaceSelector"]["matchLabels"] == {"throttledjob.io/attach": "enabled"}
    assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
            "values": ["kube-system", NAMESPACE]} in hook["namespaceSelector"]["matchExpressions"]
    assert hook["objectSelector"] == {"matchExpressions": [
        {"key": children.LABEL_NAME, "operator": "DoesNotExist"}]}
    (svc,) = [s for s in by_kind(objs, "Service")
              if s["metadata"]["name"] == hook["clientConfig"]["service"]["name"]]
    assert svc["spec"]["ports"][0]["port"] == hook["clientConfig"]["service"]["port"]
    (deploy,) = by_kind(objs, "Deployment")
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    settings = OperatorSettings.from_env(env)
    assert settings.webhook_port == ports[svc["spec"]["ports"][0]["targetPort"]]
    assert f"{svc['metadata']['name']}.{NAMESPACE}.svc" in settings.webhook_hosts
    assert settings.webhook_config == mwc["metadata"]["name"]
    pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()


def test_the_attach_webhook_sees_only_the_watched_namespaces(tmp_path) -> None:
    """With watchNamespaces the operator may read ThrottledJobs there alone: a pod of any
    other namespace is not sent to the webhook at all."""
    objs = render({"attach": {"enabled": True}, "watchNamespaces": ["ml", "etl"]}, tmp_path)
    (mwc,) = by_kind(objs, "MutatingWebhookConfiguration")
    assert mwc["webhooks"][0]["namespaceSelector"] == {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["ml", "etl"]}]}


def test_the_attach_webhook_port_is_open_to_the_api_server_alone(tmp_path) -> None:
    values = {**ALL_ON, "attach": {"enabled": True, "apiServerCIDRs": ["10.0.0.1/32"]}}
    (policy,) = [p for p in by_kind(render(values, tmp_path), "NetworkPolicy")
                 if p["metadata"]["name"].endswith("-operator")]
    rule = next(r for r in policy["spec"]["ingress"] if r["ports"] == [{"protocol": "TCP",
                                                                        "port": 9443}])
    assert rule["from"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}]
