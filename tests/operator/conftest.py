"""Fixtures for operator tests: a sandbox cluster, the real operator (Kopf) in-process, and an API client.

Tests act and assert only through the Kubernetes API, as a user would with kubectl.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from deviceshare.operator.config import OperatorConfig
from deviceshare.operator.process import OperatorThread
from deviceshare.sandbox import Sandbox
from tests import waiting
from tests.operator.kube import Kube


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    """Override in a test module (or parametrize indirectly) for other cluster shapes."""
    return {"nodes": 4, "gpus": 8}


@pytest.fixture
async def cluster(tmp_path: Path, sandbox_options: dict[str, object]) -> AsyncIterator[Sandbox]:
    # A short bookmark interval also makes server-side watch handlers notice a gone client quickly;
    # Kopf waits up to 5 s at shutdown for tasks started after it, which in-process includes them.
    options = {
        "kubelet_delay": 0.01, "kubeconfig_path": tmp_path / "kubeconfig", "bookmark_interval": 0.1,
        **sandbox_options,
    }
    async with Sandbox(**options) as sandbox:  # type: ignore[arg-type]
        yield sandbox


@pytest.fixture
async def kube(cluster: Sandbox) -> AsyncIterator[Kube]:
    async with Kube.connect(str(cluster.kubeconfig)) as k:
        yield k


def operator_config(cluster: Sandbox, **overrides: object) -> OperatorConfig:
    base = OperatorConfig(
        kubeconfig=str(cluster.kubeconfig),
        metrics_port=None,
        backoff_initial=0.05,
        backoff_max=0.4,
        unschedulable_flush=1.0,
        status_debounce=0.01,
        election_settle=0.2,
        worker_idle_timeout=0.2,
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


RunningOperator = OperatorThread


async def start_operator(config: OperatorConfig) -> OperatorThread:
    return await OperatorThread(config).start(timeout=waiting.HANG_GUARD)


@pytest.fixture
async def operator(cluster: Sandbox) -> AsyncIterator[RunningOperator]:
    running = await start_operator(operator_config(cluster))
    yield running
    await running.stop()
