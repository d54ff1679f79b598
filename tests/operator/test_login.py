"""Finding the cluster (login.py) and the operator's own client (kube.Kube): kubeconfigs
as kubectl writes them, the pod's service account, a token rotated under a running
operator (once for all its threads), and a status write that finds the object gone."""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import kopf
import pytest

from testing.emulator import TJ_PATH, Emulator, Fault
from throttledjob.operator import login
from throttledjob.operator.kube import ApiError, Kube

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def kubeconfig(path: Path, cluster: dict, user: dict, current: str = "c") -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": current,
        "clusters": [{"name": "k", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u",
                                               "namespace": "team"}}]}))
    return path


def test_a_kubeconfig_gives_the_server_its_ca_and_the_users_credentials(
        tmp_path: Path) -> None:
    data = base64.b64encode(PEM.encode()).decode()
    (tmp_path / "certs").mkdir()
    info = login.connection_info(kubeconfig(
        tmp_path / "config",
        {"server": "https://10.0.0.1:6443", "certificate-authority": "certs/ca.crt"},
        {"client-certificate-data": data, "client-key": "/abs/user.key"}))
    assert (info.server, info.ca_path, info.certificate_data, info.private_key_path,
            info.token, info.default_namespace) == (
        "https://10.0.0.1:6443", str(tmp_path / "certs/ca.crt"), data, "/abs/user.key",
        None, "team")
    (tmp_path / "token").write_text("abc\n")
    info = login.connection_info(kubeconfig(
        tmp_path / "config", {"server": "https://h", "certificate-authority-data": data},
        {"tokenFile": "token"}))
    assert (info.ca_data, info.token, info.as_http_headers()) == (
        data, "abc", {"Authorization": "Bearer abc"})


EXEC_API = "client.authentication.k8s.io/v1"


def exec_plugin(path: Path, token: str) -> dict:
    """A kubeconfig user whose token comes from an exec plugin, as EKS's `aws eks
    get-token` gives one: a script that prints an ExecCredential."""
    credential = {"apiVersion": EXEC_API, "kind": "ExecCredential",
                  "status": {"token": token}}
    path.write_text(f"#!/bin/sh\necho '{json.dumps(credential)}'\n")
    path.chmod(0o755)
    return {"exec": {"apiVersion": EXEC_API, "command": str(path),
                     "interactiveMode": "Never"}}


def test_an_exec_plugins_token_is_the_login(tmp_path: Path) -> None:
    data = base64.b64encode(PEM.encode()).decode()
    info = login.connection_info(kubeconfig(
        tmp_path / "config", {"server": "https://10.0.0.1:6443",
                              "certificate-authority-data": data},
        exec_plugin(tmp_path / "plugin", "from-the-plugin")))
    assert (info.server, info.token, info.default_namespace, info.insecure) == (
        "https://10.0.0.1:6443", "from-the-plugin", "team", False)
    assert info.as_http_headers() == {"Authorization": "Bearer from-the-plugin"}
    assert Path(info.ca_path or "").read_text() == PEM  # the client's copy of the data


def test_without_the_kubernetes_client_an_exec_plugin_says_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # import kubernetes: ImportError
    path = kubeconfig(tmp_path / "config", {"server": "https://h"},
                      exec_plugin(tmp_path / "plugin", "t"))
    with pytest.raises(login.LoginError, match=r"pip install 'throttledjob\[cloud\]'"):
        login.connection_info(path)


@pytest.mark.parametrize("cluster, user, current, error", [
    ({"server": "https://h"}, {"exec": {"apiVersion": EXEC_API, "command": "/no/such-plugin"}},
     "c", "/no/such-plugin"),
    ({"server": "https://h"}, {"token": "t"}, "other", "no context 'other'"),
    ({}, {"token": "t"}, "c", "KeyError: 'server'"),
])
def test_a_kubeconfig_it_cannot_use_is_refused_in_one_line_naming_why(
        tmp_path: Path, cluster: dict, user: dict, current: str, error: str) -> None:
    path = kubeconfig(tmp_path / "config", cluster, user, current)
    with pytest.raises(login.LoginError, match=error) as raised:
        login.connection_info(path)
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_a_kubeconfig_that_is_not_a_mapping_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text("- just\n- a list\n")
    with pytest.raises(login.LoginError, match=f"{path}: AttributeError"):
        login.connection_info(path)


def test_a_missing_kubeconfig_is_named(tmp_path: Path) -> None:
    with pytest.raises(login.LoginError, match=f"{tmp_path / 'nowhere'}.*FileNotFound"):
        login.connection_info(tmp_path / "nowhere")


def test_in_a_pod_the_service_account_and_the_kubelets_address_are_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "namespace").write_text("throttledjob-system")
    monkeypatch.setattr(login, "SERVICE_ACCOUNT", tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "never-read"))
    info = login.connection_info()
    assert (info.server, info.token, info.ca_path, info.default_namespace) == (
        "https://[fd00::1]:443", "sa-token", str(tmp_path / "ca.crt"), "throttledjob-system")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")  # not in a pod: the kubeconfig
    with pytest.raises(login.LoginError, match="never-read"):
        login.connection_info()


def test_a_rotated_token_is_read_again_after_a_401(emulator: Emulator) -> None:
    """The kubelet rotates a service account's token under the running operator: the
    server's 401 makes the client log in again and repeat the call, once."""
    logins: list[str] = []

    def rotating() -> kopf.ConnectionInfo:
        logins.append(f"token-{len(logins)}")
        return kopf.ConnectionInfo(server=emulator.url, token=logins[-1])

    expired = Fault("GET", r"/throttledjobs$", status=401, times=100,
                    authorization="Bearer token-0")
    emulator.handler.faults.append(expired)
    kube = Kube(rotating)
    assert kube.request("GET", TJ_PATH)["items"] == []  # repeated with token-1
    assert (expired.hits, logins, kube.headers) == (
        1, ["token-0", "token-1"], {"Authorization": "Bearer token-1"})
    emulator.handler.faults.append(Fault("GET", r"/throttledjobs$", status=401, times=2))
    with pytest.raises(ApiError, match="HTTP 401") as second:  # not retried again
        kube.request("GET", TJ_PATH)
    assert second.value.status == 401 and len(logins) == 3


def test_a_login_that_fails_after_a_401_is_an_api_error_the_callers_handle(
        emulator: Emulator) -> None:
    calls: list[int] = []

    def once() -> kopf.ConnectionInfo:
        calls.append(1)
        if len(calls) > 1:
            raise login.LoginError("the token file is gone")
        return kopf.ConnectionInfo(server=emulator.url, token="t")

    emulator.handler.faults.append(Fault("GET", r"/throttledjobs$", status=401))
    with pytest.raises(ApiError, match="logging in again failed: the token file is gone"):
        Kube(once).request("GET", TJ_PATH)


def test_kubectl_takes_the_data_where_a_kubeconfig_gives_a_file_and_its_data(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = base64.b64encode(PEM.encode()).decode()
    path = kubeconfig(tmp_path / "config", {"server": "https://h", "certificate-authority":
                                            "ca.crt", "certificate-authority-data": data},
                      {"token": "t"})
    info = login.connection_info(path)
    assert (info.ca_path, info.ca_data) == (None, data)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", f"{os.pathsep}{path}")  # an empty entry is skipped
    assert login.connection_info().server == "https://h"


def test_threads_that_meet_the_same_401_log_in_again_once(emulator: Emulator) -> None:
    """Every handler and poller thread meets an expired token at once: one of them logs
    in anew, the others repeat their call on its session."""
    logins: list[int] = []
    emulator.handler.faults.append(Fault("GET", r"/throttledjobs$", status=401, times=100,
                                         authorization="Bearer t1"))  # the first login's
    kube = Kube(lambda: logins.append(1) or kopf.ConnectionInfo(server=emulator.url,
                                                                token=f"t{len(logins)}"))
    barrier = threading.Barrier(8)

    def call() -> list[Any]:
        barrier.wait()
        return kube.request("GET", TJ_PATH)["items"]

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda _: call(), range(8))) == [[]] * 8
    assert len(logins) == 2


def test_a_status_write_to_a_throttledjob_deleted_since_the_read_is_nothing(
        emulator: Emulator) -> None:
    """Deleted between the read and the write (the poller meets this while a namespace
    is emptied): no error, no retry, as for one already gone at the read."""
    from testing.manifests import NAMESPACE, make_tj

    emulator.call("POST", TJ_PATH, make_tj("gone"), content_type="application/json")
    gone = Fault("PATCH", r"/throttledjobs/gone/status$", status=404)
    emulator.handler.faults.append(gone)
    kube = Kube(lambda: kopf.ConnectionInfo(server=emulator.url, token="t"))
    assert kube.update_status(NAMESPACE, "gone", lambda st, _: {**st, "phase": "x"}) is None
    assert gone.hits == 1
