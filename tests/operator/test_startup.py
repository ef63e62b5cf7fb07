"""Start-up that heals: an operator started before its API server comes up recovers by itself.

The API here is a sandbox started late on a port fixed in advance, as a control plane that restarts
after the operator. Nothing restarts the operator from outside; what a kubelet's probes would see is
checked along the way (liveness 200 throughout, readiness 503 until connected).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import time
from pathlib import Path

import aiohttp
import pytest
import yaml

from deviceshare.operator.config import OperatorConfig
from deviceshare.operator.process import OperatorThread
from deviceshare.sandbox import Sandbox
from tests.operator.kube import Kube

GPU = "nvidia.com/gpu"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kubeconfig_for(url: str, path: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "late",
        "clusters": [{"name": "late", "cluster": {"server": url}}],
        "users": [{"name": "late", "user": {"token": "t"}}],
        "contexts": [{"name": "late", "context": {"cluster": "late", "user": "late"}}],
    }))
    return path


async def probe(port: int, path: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}{path}") as resp:
        return resp.status


async def test_api_up_5s_after_the_operator_a_pod_is_bound_within_15s_of_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    api_port = free_port()
    kubeconfig = kubeconfig_for(f"http://127.0.0.1:{api_port}", tmp_path / "kubeconfig")
    # Production backoff (capped at 10 s): the 15 s budget below is the one the issue sets.
    config = OperatorConfig(
        kubeconfig=str(kubeconfig), metrics_host="127.0.0.1", metrics_port=0,
        status_debounce=0.01, worker_idle_timeout=0.2,
    )
    operator = OperatorThread(config)
    starting = asyncio.get_running_loop().create_task(operator.start(timeout=60))
    try:
        await asyncio.sleep(5)
        assert not starting.done(), "the operator claimed to be ready with no API server"
        assert operator.alive
        port = operator.memo.metrics_server.port
        assert await probe(port, "/healthz") == 200  # alive: no reason to restart it
        assert await probe(port, "/readyz") == 503  # not connected: not ready

        async with Sandbox(port=api_port, kubeconfig_path=tmp_path / "sandbox-kubeconfig",
                           kubelet_delay=0.01, bookmark_interval=0.1) as cluster:
            up = time.monotonic()
            async with Kube.connect(str(cluster.kubeconfig)) as kube:
                await kube.create_group("late", "g", {GPU: 1})
                await kube.create_pod("late", "p", "g")
                pod = await kube.wait_bound("late", "p")
            bound_after = time.monotonic() - up
            print(f"pod bound {bound_after:.1f}s after the API came up")
            assert pod["spec"]["nodeName"]
            assert bound_after < 15, f"bound {bound_after:.1f}s after the API came up"
            await starting
            assert await probe(port, "/readyz") == 200
            await operator.stop()
    finally:
        if not starting.done():
            starting.cancel()
        await operator.stop()
    gc.collect()
    log = caplog.text
    assert "address already in use" not in log
    assert "Unclosed client session" not in log
    assert "cannot start yet" in log  # it did fail first, and said so in one line per try
