"""The operator as the chart runs it with attach.enabled, for the tests of attach mode on
the real API server: its ServiceAccount and RBAC (so the real authorizer judges each of
its calls), its webhook settings and its MutatingWebhookConfiguration, served on
loopback (the API server runs on this machine) and for one namespace alone."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from testing.cluster_cli import OPERATOR_NAMESPACE, Kubectl, helm_template, operator_identity
from testing.http import free_port
from testing.operator_process import OperatorProcess
from throttledjob.operator.admission import PATH


@contextlib.contextmanager
def attach_operator(cluster: Any, kubectl: Kubectl, namespace: str, tmp: Path,
                    release: str, values: dict[str, Any] | None = None,
                    ) -> Iterator[OperatorProcess]:
    """The operator (not started) and its webhook's configuration (applied) for the
    chart's `values` with attach on; on the way out the operator stops (its log printed
    where the block failed) and what was made here goes."""
    values = {**(values or {}), "attach": {"enabled": True}}
    port = free_port()
    kubeconfig, _, rbac = operator_identity(cluster, kubectl, release, values, tmp)
    objs = helm_template(release, values, tmp)
    (mwc,) = [o for o in objs if o["kind"] == "MutatingWebhookConfiguration"]
    (deploy,) = [o for o in objs if o["kind"] == "Deployment"]
    env = {e["name"]: e["value"] for e in deploy["spec"]["template"]["spec"]["containers"][0]
           ["env"] if e["name"].startswith("THROTTLEDJOB_WEBHOOK_")}
    (hook,) = mwc["webhooks"]
    hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{PATH}"}
    hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    op = OperatorProcess(kubeconfig, tmp)
    op.env.update({**env, "THROTTLEDJOB_WEBHOOK_PORT": str(port),
                   "THROTTLEDJOB_WEBHOOK_HOSTS": "127.0.0.1"})
    secret = env["THROTTLEDJOB_WEBHOOK_SECRET"].split("/")[1]
    kubectl.apply(mwc)
    try:
        yield op
    except BaseException:
        print(f"--- operator log ---\n{op.log_text()}")
        raise
    finally:
        op.stop()
        kubectl("delete", "--ignore-not-found",
                f"mutatingwebhookconfiguration/{mwc['metadata']['name']}")
        kubectl("delete", "--ignore-not-found", "-n", OPERATOR_NAMESPACE, f"secret/{secret}")
        for obj in rbac:
            if obj["kind"] == "ServiceAccount":
                continue
            ns = obj["metadata"].get("namespace")
            kubectl("delete", "--ignore-not-found", *(["-n", ns] if ns else []),
                    f"{obj['kind'].lower()}/{obj['metadata']['name']}")
