"""The webhook's HTTPS edge (admission.WebhookServer) on a real socket: it answers an
AdmissionReview over TLS with the certificate the operator made, and clients that
connect and never finish their handshake hold no one else's admission."""

from __future__ import annotations

import datetime as dt
import json
import socket
import ssl
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from testing.builders import SETTINGS
from throttledjob.operator import admission, webhook_certs
from throttledjob.operator.attach import Owner


class NoThrottledJobs:
    def owner(self, namespace: str, owner: Owner) -> Mapping[str, Any] | None:
        return None

    def attached(self, namespace: str) -> list[Mapping[str, Any]]:
        return []


def review(uid: str) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": uid, "operation": "CREATE", "namespace": "ns",
                                   "object": {"metadata": {"name": "p"},
                                              "spec": {"containers": []}}}}).encode()


def test_an_answer_is_not_held_by_clients_that_never_finish_their_handshake(
        tmp_path: Path) -> None:
    pair = webhook_certs.make_pair(["127.0.0.1"], dt.datetime.now(dt.timezone.utc))
    (tmp_path / "tls.crt").write_bytes(pair.cert)
    (tmp_path / "tls.key").write_bytes(pair.key)
    server = admission.WebhookServer(0, tmp_path, NoThrottledJobs(), SETTINGS).start()
    stalled = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
    try:
        context = ssl.create_default_context(cadata=pair.ca.decode())
        started = time.monotonic()
        request = urllib.request.Request(f"https://127.0.0.1:{server.port}{admission.PATH}",
                                         data=review("u-1"), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            doc = json.loads(answer.read())
        assert doc["response"] == {"uid": "u-1", "allowed": True}
        # The API server waits up to its timeoutSeconds (the chart's 5) for an answer.
        assert time.monotonic() - started < 2.0
    finally:
        for s in stalled:
            s.close()
        server.stop()
