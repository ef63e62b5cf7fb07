"""``deviceshare webhook`` as a process: kubeconfig, readiness, SIGHUP reload, clean SIGTERM."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import ssl
import sys
from pathlib import Path

import aiohttp
import yaml

from deviceshare.webhooks import certs
from tests import waiting
from tests.webhooks import fakeapi
from tests.webhooks.fakeapi import GROUPS
from tests.webhooks.test_admission import make_review, pod

SRC = Path(__file__).resolve().parents[2] / "src"


def kubeconfig_for(url: str, path: Path) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": url}}],
                "users": [{"name": "me", "user": {"token": "t"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me"}}],
                "current-context": "fake",
            }
        )
    )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def get_status(url: str, ca_pem: bytes) -> int:
    connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cadata=ca_pem.decode()))
    async with aiohttp.ClientSession(connector=connector) as s, s.get(url) as r:
        return r.status


async def test_serves_reloads_on_sighup_and_stops_on_sigterm(
    fake_api: fakeapi.FakeApi, tmp_path: Path, bundle: certs.CertBundle, tls_files: tuple[Path, Path, Path]
) -> None:
    fake_api.put(GROUPS, fakeapi.group("ml", "trainer"))
    env_config = tmp_path / "env.yaml"
    env_config.write_text("envNames:\n  nvidia.com/: [CUDA_VISIBLE_DEVICES]\n")
    _, cert, key = tls_files
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "deviceshare", "webhook",
        "--tls-cert", str(cert), "--tls-key", str(key), "--host", "127.0.0.1", "--port", str(port),
        "--kubeconfig", str(kubeconfig_for(fake_api.url, tmp_path / "kubeconfig")),
        "--env-config", str(env_config), "--reload-interval", "3600", "--drain-seconds", "0",
        env={**os.environ, "PYTHONPATH": str(SRC), "DEVICESHARE_SCHEDULER_NAME": "sched-x"},
    )  # fmt: skip
    try:
        async def answers(path: str, ca_pem: bytes) -> bool:
            try:
                return await get_status(url + path, ca_pem) == 200
            except aiohttp.ClientConnectionError:  # not listening yet, or (after the rotation) the old CA
                return False

        await waiting.until(lambda: answers("/readyz", bundle.ca_pem), "the webhook ready", interval=0.1)
        connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cadata=bundle.ca_pem.decode()))
        body = json.dumps(make_review(pod("trainer")))
        async with (
            aiohttp.ClientSession(connector=connector) as s,
            s.post(url + "/mutate-pods", data=body) as r,
        ):
            answer = await r.json()
        assert answer["response"]["allowed"] is True
        patch = json.loads(base64.b64decode(answer["response"]["patch"]))
        assert patch[0]["value"] == "sched-x"
        assert patch[-1]["value"][0]["name"] == "CUDA_VISIBLE_DEVICES"

        rotated = certs.generate(["127.0.0.1"])
        rotated.write(cert.parent)
        proc.send_signal(signal.SIGHUP)
        await waiting.until(lambda: answers("/healthz", rotated.ca_pem), "the new certificate served")

        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(waiting.HANG_GUARD):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
