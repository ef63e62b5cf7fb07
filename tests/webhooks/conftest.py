"""Fixtures for the webhook tests: a fake API server, a client for it, certificates."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from deviceshare.webhooks import certs
from tests.webhooks import fakeapi


@pytest.fixture
async def fake_api() -> AsyncIterator[fakeapi.FakeApi]:
    api = fakeapi.FakeApi()
    await api.start()
    yield api
    await api.stop()


@pytest.fixture
async def api_client(fake_api: fakeapi.FakeApi) -> AsyncIterator[client.ApiClient]:
    async with client.ApiClient(configuration=client.Configuration(host=fake_api.url)) as api:
        yield api


@pytest.fixture(scope="session")
def bundle() -> certs.CertBundle:
    return certs.generate(["localhost", "127.0.0.1"])


@pytest.fixture
def tls_files(tmp_path: Path, bundle: certs.CertBundle) -> tuple[Path, Path, Path]:
    return bundle.write(tmp_path / "tls")
