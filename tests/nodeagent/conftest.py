"""Fixtures for the node agent: a sandbox cluster, an agent on one of its nodes over the real HTTP API,
and a count of the writes the API server received for nodes (counted there, not by the agent)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from prometheus_client import CollectorRegistry

from deviceshare.kube import connecting
from deviceshare.nodeagent import agent, nvmlsource, publishing
from deviceshare.sandbox import Sandbox
from tests import waiting
from tests.nodeagent import fakenvml, servers


@dataclasses.dataclass
class NodeWrites:
    """PATCH/PUT requests for Node objects that reached the API server (whatever their answer)."""

    by_node: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.by_node.values())


def count_node_writes(cluster: Sandbox) -> NodeWrites:
    writes = NodeWrites()
    serve = cluster.api._serve

    async def counting(request: Any) -> Any:
        path = request.url.path
        if str(request.method.value).upper() in ("PATCH", "PUT") and path.startswith("/api/v1/nodes/"):
            name = path.split("/")[4]
            writes.by_node[name] = writes.by_node.get(name, 0) + 1
        return await serve(request)

    cluster.api._serve = counting  # type: ignore[method-assign]
    return writes


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Sandbox]:
    async with Sandbox(nodes=2, gpus=8, kubelet_delay=None, kubeconfig_path=tmp_path / "kubeconfig",
                       bookmark_interval=0.1) as sandbox:
        yield sandbox


@pytest.fixture
async def api(cluster: Sandbox) -> AsyncIterator[k8s.ApiClient]:
    async with await connecting.api_client(str(cluster.kubeconfig)) as client:
        yield client


@dataclasses.dataclass
class Agent:
    agent: agent.NodeAgent
    nvml: fakenvml.FakeNvml
    registry: CollectorRegistry

    def writes(self, result: str) -> float:
        value = self.registry.get_sample_value("deviceshare_node_agent_annotation_writes_total", {"result": result})
        return value or 0.0


MakeAgent = Callable[..., Agent]


@pytest.fixture
def make_agent(api: k8s.ApiClient) -> MakeAgent:
    def make(node: str = "gpu-node-0", server: servers.Server = servers.DGX_A100, *,
             client: k8s.ApiClient | None = None, timeout: float = 10.0, **config: Any) -> Agent:
        nvml = fakenvml.FakeNvml(server)
        source = nvmlsource.NvmlSource(nvml)
        source.start()
        registry = CollectorRegistry()
        node_api = publishing.NodeApi(client or api, node, publishing.writes_counter(registry), timeout=timeout)
        return Agent(agent.NodeAgent(node_api, [source], agent.AgentConfig(**config)), nvml, registry)

    return make


async def until(probe: Callable[[], Any], what: str, timeout: float = waiting.HANG_GUARD) -> Any:
    """Poll a synchronous probe of the sandbox store until it is truthy (the event it waits for)."""
    return await waiting.until(probe, what, timeout=timeout)
