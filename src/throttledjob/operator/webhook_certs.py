"""The admission webhook's certificate, made and rotated by the operator itself, as
Kueue's and JobSet's controllers do theirs: a self-signed CA and a serving certificate
for the webhook's Service, kept in a Secret (so every replica and every restart serves
the same one), the CA written into the MutatingWebhookConfiguration's caBundle. Where
the user has cert-manager, the chart lets it do all of this instead (docs/install.md).

`make_pair` and `due` are pure; `ensure` is the edge (the API through Kube).
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from .kube import ApiError, Kube

VALID_DAYS = 365
# Made anew this long before it ends: a restart or the daily check finds it due.
RENEW_BEFORE_DAYS = 30
KEYS = ("ca.crt", "tls.crt", "tls.key")


@dataclass(frozen=True)
class Pair:
    """PEMs: the CA's certificate, the serving certificate and its key."""

    ca: bytes
    cert: bytes
    key: bytes


def make_pair(hosts: Sequence[str], now: dt.datetime) -> Pair:
    """A CA and a serving certificate it signed for `hosts` (DNS names or IPs), each
    VALID_DAYS long."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def alt(host: str) -> x509.GeneralName:
        try:
            return x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            return x509.DNSName(host)

    until = now + dt.timedelta(days=VALID_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("throttledjob-webhook-ca"))
          .issuer_name(name("throttledjob-webhook-ca")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now)
          .not_valid_after(until)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                       crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False,
                                       decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(name(hosts[0]))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(until)
            .add_extension(x509.SubjectAlternativeName([alt(h) for h in hosts]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return Pair(ca.public_bytes(pem), cert.public_bytes(pem),
                key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))


def due(cert_pem: bytes, hosts: Sequence[str], now: dt.datetime) -> bool:
    """Whether a serving certificate must be made anew: unreadable, ending within
    RENEW_BEFORE_DAYS, or not for every one of `hosts`."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return True
    have = {str(n.value) for n in names}
    left = cert.not_valid_after_utc - now
    return left < dt.timedelta(days=RENEW_BEFORE_DAYS) or not set(hosts) <= have


def ensure(kube: Kube, namespace: str, secret: str, webhook_config: str | None,
           hosts: Sequence[str], now: dt.datetime) -> Pair:
    """The pair in the Secret, made anew where it is missing or due; the CA in every
    webhook of `webhook_config` (where named). Two replicas racing: the second create
    or update is refused with a conflict and it takes the first one's."""
    path = f"/api/v1/namespaces/{namespace}/secrets/{secret}"
    current = kube.get(path)
    pair = _read(current)
    if pair is None or due(pair.cert, hosts, now):
        pair = make_pair(hosts, now)
        data = {k: base64.b64encode(v).decode() for k, v in zip(KEYS, _pems(pair), strict=True)}
        body = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                "metadata": {"name": secret}, "data": data}
        try:
            if current is None:
                kube.create(f"/api/v1/namespaces/{namespace}/secrets", body)
            else:
                body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                kube.request("PUT", path, body)
        except ApiError as e:
            if e.status != 409:
                raise
        pair = _read(kube.get(path)) or pair
    if webhook_config:
        _set_ca_bundle(kube, webhook_config, pair.ca)
    return pair


def read(kube: Kube, namespace: str, secret: str) -> Pair:
    """The pair in a Secret someone else keeps (cert-manager's); ValueError where it is
    not there or not whole."""
    pair = _read(kube.get(f"/api/v1/namespaces/{namespace}/secrets/{secret}"))
    if pair is None:
        raise ValueError(f"Secret {namespace}/{secret} has no {', '.join(KEYS)}")
    return pair


def _pems(pair: Pair) -> tuple[bytes, bytes, bytes]:
    return pair.ca, pair.cert, pair.key


def _read(secret: dict | None) -> Pair | None:
    data = (secret or {}).get("data") or {}
    if not all(k in data for k in KEYS):
        return None
    return Pair(*(base64.b64decode(data[k]) for k in KEYS))


def _set_ca_bundle(kube: Kube, name: str, ca: bytes) -> None:
    """The CA in each webhook of the MutatingWebhookConfiguration `name` (the chart's,
    which the operator may patch by that name alone)."""
    path = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{name}"
    config = kube.get(path)
    if config is None:
        return
    bundle = base64.b64encode(ca).decode()
    hooks = config.get("webhooks") or []
    if all((h.get("clientConfig") or {}).get("caBundle") == bundle for h in hooks):
        return
    for h in hooks:
        h.setdefault("clientConfig", {})["caBundle"] = bundle
    kube.request("PUT", path, config)
