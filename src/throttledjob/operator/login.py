"""Where the cluster is and who we are to it: read once for kopf's watches and for our
own calls (kube.py), from the pod's service account, else the kubeconfig that kubectl
would use.

What a pod and most kubeconfigs need is small: the server, its CA, and a bearer token or
a client certificate, kept in kopf's own ConnectionInfo (which makes the TLS context and
the Authorization header for both). The official `kubernetes` client cost the operator
about 20 MiB of its memory for that, and kopf imports it whenever it is installed. A
kubeconfig whose user is an exec plugin or an auth provider (how EKS, GKE and AKS are
reached) is the exception: those are the client's job (`via_client`, as kopf's own
login does), so it is an extra (`[cloud]`) that the image does not install.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kopf
import yaml

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class LoginError(RuntimeError):
    """No usable cluster address and credentials."""


def connection_info(kubeconfig: str | Path | None = None) -> kopf.ConnectionInfo:
    """The in-cluster service account (when `kubeconfig` is not given and the pod has
    one), else `kubeconfig`, $KUBECONFIG (its first file) or ~/.kube/config."""
    if kubeconfig is None:
        found = in_cluster()
        if found is not None:
            return found
        files = [f for f in (os.environ.get("KUBECONFIG") or "").split(os.pathsep) if f]
        kubeconfig = files[0] if files else Path.home() / ".kube" / "config"
    return from_kubeconfig(Path(kubeconfig).expanduser())


def in_cluster() -> kopf.ConnectionInfo | None:
    """The pod's service account, the way client-go finds it: the API server's address
    from the environment the kubelet sets (no DNS needed), the token and CA mounted."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    token = SERVICE_ACCOUNT / "token"
    if not host or not token.exists():
        return None
    port = os.environ.get("KUBERNETES_SERVICE_PORT") or "443"
    namespace = SERVICE_ACCOUNT / "namespace"
    return kopf.ConnectionInfo(
        server=f"https://{f'[{host}]' if ':' in host else host}:{port}",
        ca_path=str(SERVICE_ACCOUNT / "ca.crt"), token=token.read_text().strip(),
        default_namespace=namespace.read_text().strip() if namespace.exists() else None)


def from_kubeconfig(path: Path) -> kopf.ConnectionInfo:
    """The current context of one kubeconfig file."""
    try:
        return _current_context(path)
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError, ValueError) as e:
        raise LoginError(f"cannot read the kubeconfig {path}: {type(e).__name__}: {e}") from e


def _current_context(path: Path) -> kopf.ConnectionInfo:
    config = yaml.safe_load(path.read_text()) or {}
    context = _named(config, "contexts", config.get("current-context"))["context"]
    cluster = _named(config, "clusters", context.get("cluster"))["cluster"]
    user = _named(config, "users", context.get("user"))["user"] or {}
    if "exec" in user or "auth-provider" in user:
        return via_client(path, context.get("namespace"),
                          (user.get("exec") or {}).get("command") or "its auth provider")

    def file(key: str) -> str | None:  # relative paths are relative to the kubeconfig
        value = user.get(key) if key in user else cluster.get(key)
        return str(path.parent / value) if value else None

    token = user.get("token")
    if not token and user.get("tokenFile"):
        token = Path(file("tokenFile") or "").read_text().strip()
    # Where a kubeconfig gives both a file and its data, kubectl takes the data.
    return kopf.ConnectionInfo(
        server=cluster["server"], insecure=cluster.get("insecure-skip-tls-verify"),
        ca_data=cluster.get("certificate-authority-data"),
        ca_path=None if cluster.get("certificate-authority-data")
        else file("certificate-authority"),
        certificate_data=user.get("client-certificate-data"),
        certificate_path=None if user.get("client-certificate-data")
        else file("client-certificate"),
        private_key_data=user.get("client-key-data"),
        private_key_path=None if user.get("client-key-data") else file("client-key"),
        token=token, default_namespace=context.get("namespace"))


def _named(config: Mapping[str, Any], kind: str, name: str | None) -> dict[str, Any]:
    for item in config.get(kind) or []:
        if item.get("name") == name:
            return dict(item)
    raise KeyError(f"no {kind[:-1]} {name!r}")


def via_client(path: Path, namespace: str | None, plugin: str) -> kopf.ConnectionInfo:
    """The current context through the `kubernetes` client's loader, which runs the user's
    exec plugin (`aws eks get-token`, `gke-gcloud-auth-plugin`, `kubelogin`) or auth
    provider as kubectl does; its result in kopf's ConnectionInfo, read the way kopf's
    `login_via_client` reads it. Called again after a 401 (kube.py, kopf), so an expired
    token is fetched anew."""
    try:
        from kubernetes import client, config
    except ImportError:
        raise LoginError(f"{path}: the user's exec plugin or auth provider needs the "
                         "kubernetes client: pip install 'throttledjob[cloud]'") from None
    conf = client.Configuration()
    try:
        config.load_kube_config(config_file=str(path), client_configuration=conf,
                                persist_config=False)
    except Exception as e:  # the loader's and the plugin's own errors, whatever they are
        raise LoginError(f"{path}: {type(e).__name__}: {e}".splitlines()[0]) from e
    # The client keeps the token under BearerToken since version 36, before that under
    # authorization (kopf reads both the same way).
    header = (conf.get_api_key_with_prefix("BearerToken")
              or conf.get_api_key_with_prefix("authorization") or "")
    scheme, _, token = header.partition(" ") if " " in header else ("", "", header)
    if not token and not conf.cert_file:  # the client logs a plugin's failure, no more
        raise LoginError(f"{path}: the user's exec plugin or auth provider gave no "
                         f"credentials (try it by hand: {plugin})")
    return kopf.ConnectionInfo(
        server=conf.host, ca_path=conf.ssl_ca_cert, insecure=not conf.verify_ssl,
        scheme=scheme or None, token=token or None, certificate_path=conf.cert_file,
        private_key_path=conf.key_file, default_namespace=namespace)
