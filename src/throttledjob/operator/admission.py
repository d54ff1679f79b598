"""The pods' mutating admission webhook (attach mode, attach.py): a pod of a workload that
an attached ThrottledJob names is made a throttled one as the API server creates it.

It fails open, always: any error, a slow API or a pod it cannot throttle answers
"allowed" with no patch and a warning, and the chart registers it with
`failurePolicy: Ignore`, so a pod is never refused for want of a throttle. The
ThrottledJob then says which of its pods run unthrottled (observe.unthrottled).

`review` is the decision (the API behind a small interface, Cluster); `WebhookServer`
the edge: HTTPS on its own port, in a thread, beside kopf.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import ssl
import tempfile
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

from . import metrics, quota, webhook_certs
from .api_names import GROUP, PLURAL, VERSION
from .attach import (
    MAX_OWNER_DEPTH,
    Chain,
    Owner,
    as_template,
    attached,
    claimants,
    controller_of,
    pod_patch,
    throttle_label,
    throttled,
)
from .child import group
from .config import OperatorSettings
from .fleet import Fleet
from .kube import ApiError, Kube
from .validation import SpecError, validate

log = logging.getLogger("throttledjob.admission")
PATH = "/mutate-pods"
# The largest AdmissionReview read: a pod's spec is well under it.
MAX_BODY = 3 * 1024 * 1024


class Cluster(Protocol):
    """What the webhook reads of the API."""

    def owner(self, namespace: str, owner: Owner) -> Mapping[str, Any] | None:
        """The owner object, or None where it is not there (or not readable)."""

    def attached(self, namespace: str) -> list[Mapping[str, Any]]:
        """The namespace's ThrottledJobs (the attached ones are the ones read)."""


def owners(cluster: Cluster, namespace: str, pod_meta: Mapping[str, Any]) -> Chain:
    """The pod's chain of controllers, up to MAX_OWNER_DEPTH (its Job, the Job's JobSet,
    the JobSet's TrainJob; an owner that cannot be read ends the chain), the objects read
    on the way, and the first throttle label on the pod or on one of them."""
    chain = Chain([], [], throttle_label(pod_meta))
    meta: Mapping[str, Any] | None = pod_meta
    while meta is not None and len(chain.owners) < MAX_OWNER_DEPTH:
        owner = controller_of(meta)
        if owner is None:
            break
        chain.owners.append(owner)
        obj = cluster.owner(namespace, owner)
        if obj is None:
            break
        chain.objects.append(obj)
        meta = obj.get("metadata") or {}
        chain.named = chain.named or throttle_label(meta)
    return chain


def review(request: Mapping[str, Any], cluster: Cluster, settings: OperatorSettings,
           fleet: Fleet | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """(the patch, a warning for the pod's maker) for one AdmissionRequest of a pod's
    CREATE; no patch where the pod is not an attached ThrottledJob's. Under a
    ThrottleBudget the pod is made at the share `fleet` holds its ThrottledJob to (split
    in when the ThrottledJob was made), not at its own target."""
    pod = request.get("object") or {}
    namespace = request.get("namespace") or (pod.get("metadata") or {}).get("namespace", "")
    if request.get("operation") != "CREATE" or throttled(pod):
        return [], None
    # The namespace's attached ThrottledJobs first: where there are none (most pods the
    # webhook sees) the pod's owners are not read at all.
    tjs = [tj for tj in cluster.attached(namespace) if attached(tj.get("spec") or {})]
    if not tjs:
        return [], None
    chain = owners(cluster, namespace, pod.get("metadata") or {})
    found = claimants(chain.owners, chain.named, tjs)
    if not found:
        return [], None
    body = as_template(found[0], pod, chain.ranks(found[0]))
    try:
        doc = validate(body, settings.allow_host_access, settings.jobsets)
    except SpecError as e:
        return [], (f"throttledjob: pod not throttled: ThrottledJob "
                    f"{body['metadata']['name']} cannot throttle it: {e}")
    if fleet is not None:
        doc = fleet.held((namespace, body["metadata"]["name"]), doc, body["spec"])
    # The pods' policy (their ConfigMap) says the kernel holds the target: a pod whose
    # limits cannot be set would be held by nothing.
    why = quota.why_not(body["spec"], doc)
    if why:
        return [], (f"throttledjob: pod not throttled: ThrottledJob "
                    f"{body['metadata']['name']}'s enforcement Quota cannot hold it: {why}")
    return pod_patch(pod, body, doc, settings), None


def respond(review_doc: Mapping[str, Any], cluster: Cluster, settings: OperatorSettings,
            fleet: Fleet | None = None) -> dict[str, Any]:
    """The AdmissionReview answer: allowed, always; a patch where one is made; on any
    error none, and a warning that says why (failing open)."""
    request = review_doc.get("request") or {}
    answer: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
    try:
        patch, warning = review(request, cluster, settings, fleet)
        result = "injected" if patch else "skipped"
    except Exception as e:
        log.warning("admission of a pod in %s failed, allowed unthrottled: %s",
                    request.get("namespace"), e)
        patch, warning, result = [], f"throttledjob: pod not throttled: {e}", "error"
    metrics.ADMISSIONS.labels(result).inc()
    if patch:
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    if warning:
        answer["warnings"] = [warning[:256]]
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": answer}


# Plurals of the kinds a workload's chain usually holds; any other kind's is guessed the
# way most are made (lower case, an "s"). A kind not readable ends the chain there.
PLURALS = {"Job": "jobs", "CronJob": "cronjobs", "JobSet": "jobsets", "TrainJob": "trainjobs",
           "RayJob": "rayjobs", "RayCluster": "rayclusters",
           "LeaderWorkerSet": "leaderworkersets", "StatefulSet": "statefulsets",
           "ReplicaSet": "replicasets", "Workflow": "workflows"}


class KubeCluster:
    """Cluster through the operator's API client: one attempt per call, under the
    webhook's own deadline (the API server waits for the answer)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    def owner(self, namespace: str, owner: Owner) -> Mapping[str, Any] | None:
        plural = PLURALS.get(owner.kind, owner.kind.lower() + "s")
        base = f"/apis/{owner.api_version}" if group(owner.api_version) else "/api/v1"
        try:
            return self.kube.get(f"{base}/namespaces/{namespace}/{plural}/{owner.name}")
        except ApiError as e:
            if e.status != 403:
                raise
            return None

    def attached(self, namespace: str) -> list[Mapping[str, Any]]:
        doc = self.kube.request("GET", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/"
                                       f"{PLURAL}")
        return doc.get("items") or []


class WebhookServer:
    """HTTPS on `port`, POST /mutate-pods; the certificate reloaded by `reload`."""

    def __init__(self, port: int, cert_dir: Path, cluster: Cluster,
                 settings: OperatorSettings, fleet: Fleet | None = None) -> None:
        self.cert_dir = cert_dir
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.reload()
        self.httpd = _TLSServer(("", port), _handler(cluster, settings, fleet),
                                 self.context)
        self.port = self.httpd.server_address[1]

    def reload(self) -> None:
        """Serve the certificate in `cert_dir` now (new connections)."""
        self.context.load_cert_chain(self.cert_dir / "tls.crt", self.cert_dir / "tls.key")

    def start(self) -> WebhookServer:
        threading.Thread(target=self.httpd.serve_forever, name="throttledjob-webhook",
                         daemon=True).start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# How long one connection may take over its TLS handshake, and over each read and write
# after it: longer than the API server waits for an answer (the chart's timeoutSeconds).
CONNECTION_TIMEOUT_SECONDS = 15.0


class _TLSServer(ThreadingHTTPServer):
    """A thread per connection, which makes the TLS handshake itself: made in the accept
    loop (a listening socket wrapped whole), one client that connects and says nothing
    held every pod's admission until the API server gave up on it, and each such pod
    started unthrottled."""

    daemon_threads = True
    # The API server opens connections in bursts (a Job of many pods).
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 context: ssl.SSLContext) -> None:
        self.context = context
        super().__init__(address, handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(CONNECTION_TIMEOUT_SECONDS)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except OSError as e:  # ssl.SSLError too: a handshake failed or timed out
            log.debug("TLS handshake with %s failed: %s", client_address, e)
            return
        try:
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            self.shutdown_request(tls)


def _handler(cluster: Cluster, settings: OperatorSettings,
             fleet: Fleet | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = CONNECTION_TIMEOUT_SECONDS
        # Keep-alive: the API server sends a burst's admissions over a few connections,
        # not a TLS handshake each.
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if self.path.split("?")[0] != PATH or not 0 < length <= MAX_BODY:
                self.send_error(404 if self.path.split("?")[0] != PATH else 400)
                return
            try:
                doc = json.loads(self.rfile.read(length))
            except ValueError:
                self.send_error(400, "not JSON")
                return
            body = json.dumps(respond(doc, cluster, settings, fleet)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug(format, *args)

    return Handler


# How often the certificate is looked at again (renewed RENEW_BEFORE_DAYS before it ends).
CERT_CHECK_SECONDS = 6 * 3600.0
# Each read the webhook makes: under the configuration's timeoutSeconds (the chart's 5).
API_TIMEOUT_SECONDS = 2.0


def serve(settings: OperatorSettings, kube: Kube, webhook_kube: Kube,
          stop: threading.Event, fleet: Fleet | None = None) -> WebhookServer:
    """The webhook on settings.webhook_port, its certificate from the Secret (made, and
    made anew when due, where the operator manages it); a thread looks at it again every
    CERT_CHECK_SECONDS until `stop`. `webhook_kube` makes the webhook's own reads: one
    attempt each, a short deadline."""
    namespace, _, secret = settings.webhook_secret.partition("/")
    cert_dir = Path(tempfile.mkdtemp(prefix="throttledjob-webhook-"))

    def load() -> bytes:
        if settings.webhook_config:
            pair = webhook_certs.ensure(kube, namespace, secret, settings.webhook_config,
                                        settings.webhook_hosts,
                                        dt.datetime.now(dt.timezone.utc))
        else:
            pair = webhook_certs.read(kube, namespace, secret)
        (cert_dir / "tls.key").write_bytes(pair.key)
        (cert_dir / "tls.crt").write_bytes(pair.cert)
        return pair.cert

    served = load()
    server = WebhookServer(settings.webhook_port, cert_dir, KubeCluster(webhook_kube),
                           settings, fleet).start()

    def rotate() -> None:
        nonlocal served
        while not stop.wait(CERT_CHECK_SECONDS):
            try:
                cert = load()
            except (ApiError, OSError, ValueError) as e:
                log.warning("cannot renew the webhook's certificate: %s", e)
                continue
            if cert != served:
                server.reload()
                served = cert
                log.info("the webhook serves a renewed certificate")

    threading.Thread(target=rotate, name="throttledjob-webhook-cert", daemon=True).start()
    return server
