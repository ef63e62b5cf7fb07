"""Fixtures for operator tests: a sandbox cluster, the real operator (Kopf) in-process, and an API client.

Tests act and assert only through the Kubernetes API, as a user would with kubectl.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from deviceshare.kube import connecting
from deviceshare.nodeagent import agent, nvmlsource, publishing
from deviceshare.operator.config import OperatorConfig
from deviceshare.operator.process import OperatorThread
from deviceshare.sandbox import Sandbox, identity
from deviceshare.sandbox import cluster as sandbox_cluster
from tests import waiting
from tests.nodeagent import fakenvml, servers
from tests.operator.kube import Kube


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    """Override in a test module (or parametrize indirectly) for other cluster shapes."""
    return {"nodes": 4, "gpus": 8}


POLICIES = Path(__file__).resolve().parents[2] / "manifests" / "base" / "admission-policy.yaml"


@pytest.fixture
async def cluster(tmp_path: Path, sandbox_options: dict[str, object]) -> AsyncIterator[Sandbox]:
    """A sandbox of ``sandbox_options``; with ``admission_policies: True`` among them, manifests/base's admission
    policies installed (the operator then writes as its service account: ``operator_config``), as an install runs."""
    # A short bookmark interval also makes server-side watch handlers notice a gone client quickly;
    # Kopf waits up to 5 s at shutdown for tasks started after it, which in-process includes them.
    options = {
        "kubelet_delay": 0.01, "kubeconfig_path": tmp_path / "kubeconfig", "bookmark_interval": 0.1,
        **sandbox_options,
    }
    policies = bool(options.pop("admission_policies", False))
    async with Sandbox(**options) as sandbox:  # type: ignore[arg-type]
        if policies:
            for doc in sandbox_cluster.load_manifests(POLICIES):
                sandbox.create(doc)
        yield sandbox


@pytest.fixture
async def kube(cluster: Sandbox) -> AsyncIterator[Kube]:
    async with Kube.connect(str(cluster.kubeconfig)) as k:
        yield k


def operator_config(cluster: Sandbox, **overrides: object) -> OperatorConfig:
    """The test operator's settings; where admission policies are installed it writes as its service account (the
    one they trust), else as the admin."""
    policed = bool(cluster.list("validatingadmissionpolicybindings"))
    base = OperatorConfig(
        kubeconfig=str(cluster.kubeconfig_as(identity.OPERATOR_TOKEN) if policed else cluster.kubeconfig),
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


@dataclasses.dataclass
class NodeAgent:
    """A node agent reading a recorded server through the fake NVML (tests.nodeagent), as the DaemonSet would."""

    agent: agent.NodeAgent
    nvml: fakenvml.FakeNvml

    def row(self, uuid: str) -> int:
        return next(r for r in range(self.nvml.server.gpus) if self.nvml.server.uuid(r) == uuid)


@pytest.fixture
async def publish(cluster: Sandbox) -> AsyncIterator[Any]:
    """``await publish(node, server)``: an agent on ``node`` publishes once; its NVML and loop stay for the test."""
    async with await connecting.api_client(str(cluster.kubeconfig)) as client:
        async def start(node: str, server: servers.Server, **config: Any) -> NodeAgent:
            nvml = fakenvml.FakeNvml(server)
            source = nvmlsource.NvmlSource(nvml)
            source.start()
            api = publishing.NodeApi(client, node, publishing.writes_counter(CollectorRegistry()))
            made = NodeAgent(agent.NodeAgent(api, [source], agent.AgentConfig(**config)), nvml)
            await made.agent.sync()
            return made

        yield start
