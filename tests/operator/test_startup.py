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
from pathlib import Path

import aiohttp
import pytest
import yaml

from deviceshare.operator.config import OperatorConfig
from deviceshare.operator.process import OperatorThread
from deviceshare.sandbox import Sandbox
from tests import kubeconfigs, waiting
from tests.operator.conftest import operator_config, start_operator
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


async def test_an_operator_started_before_its_api_server_binds_pods_once_it_comes_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The API server comes up after the operator has failed to reach it twice. How soon after the API
    comes up the pod is bound with the production backoff (10 s cap, 15 s budget) is measured in
    ``make bench`` (benchmarks/bench_startup.py); here the backoff is short, a parameter."""
    caplog.set_level(logging.INFO)
    api_port = free_port()
    kubeconfig = kubeconfig_for(f"http://127.0.0.1:{api_port}", tmp_path / "kubeconfig")
    config = OperatorConfig(
        kubeconfig=str(kubeconfig), metrics_host="127.0.0.1", metrics_port=0,
        status_debounce=0.01, worker_idle_timeout=0.2, startup_backoff_initial=0.05, startup_backoff_max=0.2,
    )
    operator = OperatorThread(config)
    starting = asyncio.get_running_loop().create_task(operator.start(timeout=waiting.HANG_GUARD))
    try:
        await waiting.until(lambda: caplog.text.count("cannot start yet") >= 2, "two failed tries")
        assert not starting.done(), "the operator claimed to be ready with no API server"
        assert operator.alive
        port = operator.memo.metrics_server.port
        assert await probe(port, "/healthz") == 200  # alive: no reason to restart it
        assert await probe(port, "/readyz") == 503  # not connected: not ready

        async with Sandbox(port=api_port, kubeconfig_path=tmp_path / "sandbox-kubeconfig",
                           kubelet_delay=0.01, bookmark_interval=0.1) as cluster:
            async with Kube.connect(str(cluster.kubeconfig)) as kube:
                await kube.create_group("late", "g", {GPU: 1})
                await kube.create_pod("late", "p", "g")
                pod = await kube.wait_bound("late", "p")
            assert pod["spec"]["nodeName"]
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


async def test_with_two_kubeconfig_files_the_operator_connects_with_the_first_current_context(
    cluster: Sandbox, kube: Kube, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """KUBECONFIG=a:b, both setting a current context: the operator (its own client and Kopf's login) connects with
    a's, as kubectl would; b's server does not answer, so an operator that read b never binds the pod."""
    monkeypatch.setenv("KUBECONFIG", kubeconfigs.first_of_two(cluster.kubeconfig, tmp_path))
    operator = await start_operator(operator_config(cluster, kubeconfig=None))
    try:
        await kube.create_group("ml", "g", {GPU: 1})
        await kube.create_pod("ml", "p", "g")
        assert (await kube.wait_bound("ml", "p"))["spec"]["nodeName"]
    finally:
        await operator.stop()
