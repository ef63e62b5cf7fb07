"""Fixtures for operator tests: a sandbox cluster, the real operator (Kopf) in-process, and an API client.

Tests act and assert only through the Kubernetes API, as a user would with kubectl.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import kopf
import pytest

from deviceshare.operator.command import run_operator
from deviceshare.operator.config import OperatorConfig
from deviceshare.sandbox import Sandbox
from tests.operator.kube import Kube


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    """Override in a test module (or parametrize indirectly) for other cluster shapes."""
    return {"nodes": 4, "gpus": 8}


@pytest.fixture
async def cluster(tmp_path: Path, sandbox_options: dict[str, object]) -> AsyncIterator[Sandbox]:
    options = {"kubelet_delay": 0.01, "kubeconfig_path": tmp_path / "kubeconfig", **sandbox_options}
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


@dataclasses.dataclass
class RunningOperator:
    config: OperatorConfig
    stop_flag: asyncio.Event
    task: asyncio.Task[None]
    memo: kopf.Memo

    async def stop(self) -> None:
        self.stop_flag.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self.task, 15)


async def start_operator(config: OperatorConfig) -> RunningOperator:
    stop, ready, memo = asyncio.Event(), asyncio.Event(), kopf.Memo()
    task = asyncio.get_running_loop().create_task(
        run_operator(config, stop_flag=stop, ready_flag=ready, memo=memo)
    )
    waiter = asyncio.ensure_future(ready.wait())
    done, _ = await asyncio.wait({waiter, task}, timeout=15, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        waiter.cancel()
        task.result()  # raise what killed it
        raise RuntimeError("operator exited during start-up")
    if waiter not in done:
        raise TimeoutError("operator did not become ready in 15 s")
    return RunningOperator(config, stop, task, memo)


@pytest.fixture
async def operator(cluster: Sandbox) -> AsyncIterator[RunningOperator]:
    running = await start_operator(operator_config(cluster))
    yield running
    await running.stop()
