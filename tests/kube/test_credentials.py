"""kube/credentials: what keeps a long-running client authenticated and on its way to the server, as client-go does.

An exec plugin (a script here, speaking client.authentication.k8s.io/v1beta1 as aws-iam-authenticator, gke-gcloud-
auth-plugin and kubelogin do) is run again before its credential expires and after a 401; certificate files are
read again when they change; proxies come from the environment unless NO_PROXY names the server."""

from __future__ import annotations

import asyncio
import datetime
import json
import ssl
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from deviceshare.kube import connecting, credentials, http1, rest
from deviceshare.webhooks import certs
from tests.kube.test_http1 import Server, length_answer, read_request

PLUGIN = """\
import datetime, json, pathlib, sys
folder = pathlib.Path(sys.argv[1])
runs = folder / "runs"
count = int(runs.read_text()) + 1 if runs.exists() else 1
runs.write_text(str(count))
expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=15)
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
                  "status": {"token": f"token-{count}",
                             "expirationTimestamp": expiry.strftime("%Y-%m-%dT%H:%M:%SZ")}}))
"""


def exec_kubeconfig(folder: Path, server: str) -> Path:
    (folder / "plugin.py").write_text(PLUGIN)
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1", "command": sys.executable,
            "args": [str(folder / "plugin.py"), str(folder)], "interactiveMode": "Never"}}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }
    path = folder / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


class Authenticating:
    """Answers 200 to the one token it accepts now (``accepted``), 401 to any other; records what came."""

    def __init__(self) -> None:
        self.accepted = "token-1"
        self.seen: list[str] = []

    async def handler(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = (await read_request(reader)).decode("latin-1")
            except asyncio.IncompleteReadError:
                return
            token = next((line.split(" ", 2)[2] for line in head.split("\r\n")
                          if line.lower().startswith("authorization: bearer ")), "")
            self.seen.append(token)
            if token == self.accepted:
                writer.write(length_answer(b'{"ok":true}'))
            else:
                writer.write(length_answer(b'{"kind":"Status","code":401,"message":"Unauthorized"}',
                                           status="401 Unauthorized"))
            await writer.drain()


@pytest.fixture
async def auth_server() -> Any:
    auth = Authenticating()
    server = Server(auth.handler)
    server.server = await asyncio.start_server(server._serve, "127.0.0.1", 0)
    yield auth, server
    server.server.close()
    await server.server.wait_closed()


async def test_an_exec_credential_is_renewed_before_it_expires(tmp_path: Path, auth_server: Any) -> None:
    auth, server = auth_server
    api = await connecting.api_client(exec_kubeconfig(tmp_path, server.url))
    conns = http1.Connections.for_client(api)
    hook = api.configuration.refresh_api_key_hook
    assert isinstance(hook, credentials.ExecCredentials), "the kubeconfig's exec user was not recognised"
    try:
        assert await rest.call(api, "GET", "/x", timeout=5, connections=conns) == {"ok": True}
        assert (tmp_path / "runs").read_text() == "1"  # run once at load, reused while valid
        expiry = api_expiry(hook)
        auth.accepted = "token-2"  # the server moves on only when the old one expires; the clock gets there
        hook._clock = lambda: expiry - credentials.RENEW_BEFORE + 1  # a minute before expiry, less one second
        assert await rest.call(api, "GET", "/x", timeout=5, connections=conns) == {"ok": True}
        assert auth.seen == ["token-1", "token-2"]  # renewed before the request, never refused
        assert hook.runs == 1
    finally:
        if conns is not None:
            await conns.close()
        await api.close()


def api_expiry(hook: credentials.ExecCredentials) -> float:
    expiry = hook._loader.exec_plugin_expiry
    assert isinstance(expiry, datetime.datetime)
    return expiry.timestamp()


async def test_a_401_runs_the_exec_plugin_again_and_the_request_once_more(tmp_path: Path, auth_server: Any) -> None:
    auth, server = auth_server
    api = await connecting.api_client(exec_kubeconfig(tmp_path, server.url))
    conns = http1.Connections.for_client(api)
    try:
        auth.accepted = "token-2"  # revoked early (a rotated signing key): the server refuses token-1
        assert await rest.call(api, "PATCH", "/x", {}, timeout=5, connections=conns) == {"ok": True}
        assert auth.seen == ["token-1", "token-2"]
        auth.accepted = "nobody"  # a refusal a new credential does not cure is the caller's, after one retry
        with pytest.raises(rest.ApiError) as refused:
            await rest.call(api, "GET", "/x", timeout=5, connections=conns)
        assert refused.value.status == 401 and auth.seen[2:] == ["token-2", "token-3"]
    finally:
        if conns is not None:
            await conns.close()
        await api.close()


async def test_a_rotated_ca_and_server_certificate_are_trusted_from_the_next_connection(tmp_path: Path) -> None:
    from kubernetes_asyncio import client

    first, second = certs.generate(["127.0.0.1"]), certs.generate(["127.0.0.1"])
    ca_file, cert_file, key_file = first.write(tmp_path / "first")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    server = Server(answering_ok)
    server.server = await asyncio.start_server(server._serve, "127.0.0.1", 0, ssl=context)
    try:
        cfg = client.Configuration()
        cfg.host = f"https://127.0.0.1:{server.server.sockets[0].getsockname()[1]}"
        cfg.ssl_ca_cert = str(ca_file)
        api = client.ApiClient(cfg)
        conns = http1.Connections.for_client(api)
        assert conns is not None
        assert (await conns.request("GET", "/x", {}, None, timeout=5)).status == 200
        _, new_cert, new_key = second.write(tmp_path / "second")
        context.load_cert_chain(new_cert, new_key)  # the server presents the new certificate from now on
        ca_file.write_bytes(second.ca_pem + b"\n")  # and the CA bundle is rotated in place (another size)
        assert conns._tls_files is not None
        conns._tls_files._checked = -1.0  # the once-a-second look at the files is due
        await conns.close()  # the next request needs a new connection
        assert (await conns.request("GET", "/x", {}, None, timeout=5)).status == 200
        assert conns._tls_files.builds == 2
        await conns.close()
        await api.close()
    finally:
        server.server.close()
        await server.server.wait_closed()


async def test_the_watch_sessions_rotated_ca_and_server_certificate_are_trusted_from_the_next_connection(
    tmp_path: Path,
) -> None:
    """Watches and lists go through aiohttp (rest.call without http1's connections): their connections too take the
    certificate files as they are when the connection is made."""
    first, second = certs.generate(["127.0.0.1"]), certs.generate(["127.0.0.1"])
    ca_file, cert_file, key_file = first.write(tmp_path / "first")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    server = Server(answering_once)  # each answer closes its connection: the next request makes a new one
    server.server = await asyncio.start_server(server._serve, "127.0.0.1", 0, ssl=context)
    port = server.server.sockets[0].getsockname()[1]
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
              "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}",
                                                     "certificate-authority": str(ca_file)}}],
              "users": [{"name": "u", "user": {"token": "t"}}],
              "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}
    (tmp_path / "kubeconfig").write_text(json.dumps(config))
    api = await connecting.api_client(str(tmp_path / "kubeconfig"))
    try:
        assert await rest.call(api, "GET", "/x") == {}
        _, new_cert, new_key = second.write(tmp_path / "second")
        context.load_cert_chain(new_cert, new_key)  # the server presents the new certificate from now on
        ca_file.write_bytes(second.ca_pem + b"\n")  # and the CA bundle is rotated in place (another size)
        api.rest_client.pool_manager._files._checked = -1.0  # the once-a-second look at the files is due
        assert await rest.call(api, "GET", "/x") == {}  # the old CA would refuse the new certificate
        assert api.rest_client.pool_manager._files.builds == 2
    finally:
        await api.close()
        server.server.close()
        await server.server.wait_closed()


async def answering_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(length_answer(b"{}", extra="Connection: close\r\n"))
    await writer.drain()
    writer.close()


async def answering_ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        try:
            await read_request(reader)
        except asyncio.IncompleteReadError:
            return
        writer.write(length_answer(b"{}"))
        await writer.drain()


@pytest.mark.parametrize(
    ("url", "environ", "proxy"),
    [
        ("https://api.example.com:6443", {"HTTPS_PROXY": "http://proxy:3128"}, "http://proxy:3128"),
        ("https://api.example.com:6443", {"https_proxy": "proxy:3128"}, "http://proxy:3128"),
        ("https://api.example.com:6443", {"HTTP_PROXY": "http://proxy:3128"}, None),  # http's, not https's
        ("https://api.example.com", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "example.com"}, None),
        ("https://api.example.com", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": ".example.com"}, None),
        ("https://api.example.org", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "example.com"}, "http://p:1"),
        ("https://10.96.0.1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.0.0.0/8"}, None),
        ("https://10.96.0.1:443", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.96.0.1:6443"}, "http://p:1"),
        ("https://10.96.0.1:443", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "*"}, None),
        ("https://127.0.0.1:6443", {"HTTPS_PROXY": "http://p:1"}, None),  # loopback: as Go
    ],
)
def test_proxies_from_the_environment_as_go_reads_them(url: str, environ: dict[str, str], proxy: str | None) -> None:
    assert credentials.proxy_from_environment(url, environ) == proxy


async def test_a_proxy_in_the_environment_is_honoured_and_aiohttp_never_looks_it_up_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
              "clusters": [{"name": "c", "cluster": {"server": "https://api.example.com:6443"}}],
              "users": [{"name": "u", "user": {"token": "t"}}],
              "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}
    (tmp_path / "kubeconfig").write_text(json.dumps(config))
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example.com:3128")
    api = await connecting.api_client(str(tmp_path / "kubeconfig"))
    try:
        assert api.configuration.proxy == "http://proxy.example.com:3128"
        assert api.rest_client.proxy == "http://proxy.example.com:3128"  # what rest.call hands aiohttp
        assert http1.Connections.for_client(api) is None  # http1 speaks no proxy: aiohttp carries these
        assert api.rest_client.pool_manager.trust_env is False  # no netrc/proxy look-up per request
    finally:
        await api.close()


async def test_the_watch_sessions_connections_have_tcp_keepalive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Watches and lists go through aiohttp, whose connector set no keepalive: made again with http1's."""
    import socket

    made: list[socket.socket] = []

    def recording(addr_info: tuple[Any, ...]) -> socket.socket:
        sock = keepalive(addr_info)
        made.append(sock)
        return sock

    keepalive = http1.keepalive_socket
    monkeypatch.setattr(http1, "keepalive_socket", recording)
    server = Server(answering_ok)
    server.server = await asyncio.start_server(server._serve, "127.0.0.1", 0)
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
              "clusters": [{"name": "c", "cluster": {"server": server.url}}],
              "users": [{"name": "u", "user": {"token": "t"}}],
              "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}
    (tmp_path / "kubeconfig").write_text(json.dumps(config))
    api = await connecting.api_client(str(tmp_path / "kubeconfig"))
    try:
        assert await rest.call(api, "GET", "/x", timeout=5) == {}  # through the aiohttp session
        assert len(made) == 1
        assert made[0].getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert made[0].getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == http1.USER_TIMEOUT_MS
    finally:
        await api.close()
        server.server.close()
        await server.server.wait_closed()


def test_certificate_files_caught_halfway_through_a_rotation_keep_the_previous_context(tmp_path: Path) -> None:
    """A new certificate written beside the old key (the two files are not replaced at once) makes no context:
    the files as they were go on serving, and the next look after the key arrives takes the new pair."""
    from kubernetes_asyncio import client

    first, second = certs.generate(["127.0.0.1"]), certs.generate(["127.0.0.1"])
    ca_file, cert_file, key_file = first.write(tmp_path / "first")
    cfg = client.Configuration()
    cfg.host, cfg.ssl_ca_cert, cfg.cert_file, cfg.key_file = "https://127.0.0.1:1", str(ca_file), str(cert_file), str(
        key_file)
    now = [0.0]
    files = credentials.TlsFiles(cfg, clock=lambda: now[0])
    before = files.context()
    _, new_cert, new_key = second.write(tmp_path / "second")
    cert_file.write_bytes(new_cert.read_bytes())  # the certificate first: it does not match the old key
    now[0] += 2
    assert files.context() is before and files.builds == 1
    key_file.write_bytes(new_key.read_bytes())  # then its key
    now[0] += 2
    assert files.context() is not before and files.builds == 2
