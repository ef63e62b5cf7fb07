"""Certificates: what ``generate`` makes, and rotation of a serving webhook's certificate."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from kubernetes_asyncio import client

from deviceshare.webhooks import certs, server
from tests.webhooks import fakeapi


def trusting(ca_pem: bytes) -> aiohttp.TCPConnector:
    return aiohttp.TCPConnector(ssl=ssl.create_default_context(cadata=ca_pem.decode()))


async def healthz(url: str, ca_pem: bytes) -> int:
    async with aiohttp.ClientSession(connector=trusting(ca_pem)) as s, s.get(url + "/healthz") as r:
        return r.status


def test_generated_certificate_names_the_hosts(bundle: certs.CertBundle) -> None:
    cert = x509.load_pem_x509_certificate(bundle.cert_pem)
    ca = x509.load_pem_x509_certificate(bundle.ca_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert cert.issuer == ca.subject
    cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True


def test_service_hosts_cover_the_service_dns_names() -> None:
    assert "deviceshare-webhook.deviceshare-system.svc" in certs.service_hosts(
        "deviceshare-webhook", "deviceshare-system"
    )


def test_certs_command_writes_the_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from deviceshare import cli

    assert cli.main(["certs", "--out", str(tmp_path), "--host", "127.0.0.1", "--namespace", "gpu"]) == 0
    ca = (tmp_path / "ca.crt").read_bytes()
    assert (tmp_path / "tls.key").stat().st_mode & 0o077 == 0
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert certs.CertBundle(ca, b"", b"").ca_bundle == printed
    cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    assert "deviceshare-webhook.gpu.svc" in names


@pytest.fixture
async def running(
    fake_api: fakeapi.FakeApi, api_client: client.ApiClient, tls_files: tuple[Path, Path, Path]
) -> AsyncIterator[server.RunningWebhook]:
    _, cert, key = tls_files
    webhook = await server.start_webhook(
        tls_cert=cert, tls_key=key, api_client=api_client, reload_interval_s=0.02
    )
    yield webhook
    await webhook.stop()


async def test_rotation_switches_new_handshakes_and_keeps_open_connections(
    running: server.RunningWebhook, bundle: certs.CertBundle, tls_files: tuple[Path, Path, Path]
) -> None:
    _, cert_file, key_file = tls_files
    rotated = certs.generate(["localhost", "127.0.0.1"])
    async with aiohttp.ClientSession(connector=trusting(bundle.ca_pem)) as before:
        async with before.get(running.url + "/healthz") as r:
            assert r.status == 200
        assert await healthz(running.url, bundle.ca_pem) == 200
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await healthz(running.url, rotated.ca_pem)

        cert_file.write_bytes(rotated.cert_pem)
        key_file.write_bytes(rotated.key_pem)
        await fakeapi.until(lambda: running.reloader.generation == 2)

        assert await healthz(running.url, rotated.ca_pem) == 200
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await healthz(running.url, bundle.ca_pem)
        # A keep-alive connection opened before the rotation is not dropped.
        async with before.get(running.url + "/healthz") as r:
            assert r.status == 200


async def test_half_written_rotation_keeps_the_old_certificate(
    running: server.RunningWebhook, bundle: certs.CertBundle, tls_files: tuple[Path, Path, Path]
) -> None:
    _, cert_file, _ = tls_files
    other = certs.generate(["localhost", "127.0.0.1"])
    cert_file.write_bytes(other.cert_pem)  # new certificate, old key: not a pair
    registry = running.webhook.metrics.registry
    sample = "deviceshare_webhook_certificate_reloads_total"
    await fakeapi.until(lambda: (registry.get_sample_value(sample, {"result": "failed"}) or 0) >= 1)
    assert running.reloader.generation == 1
    assert await healthz(running.url, bundle.ca_pem) == 200
