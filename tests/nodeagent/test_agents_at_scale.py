"""A thousand nodes and more, each with its agent (CONTRACT §9): the API server receives a Node write only where
something changed. Writes are counted where they arrive, at the sandbox's HTTP handler, not by the agents.

The default suite runs 1,000 nodes: the same three rounds, AT_ONCE agents in flight on a connection pool
of that size, every agent on its own Node, as at 5,000; 5,000 (about 5 times as long, ~45 s on 2 cores) runs
under ``-m slow`` (``make soak``)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from kubernetes_asyncio import client as k8s
from prometheus_client import CollectorRegistry

from deviceshare.kube import connecting
from deviceshare.nodeagent import agent, nvmlsource, publishing
from deviceshare.sandbox import Sandbox
from tests.nodeagent import fakenvml, servers
from tests.nodeagent.conftest import count_node_writes

AT_ONCE = 64  # agents syncing at the same moment (a DaemonSet's agents are not synchronised either)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _all(agents: list[agent.NodeAgent], step: Callable[[agent.NodeAgent], Awaitable[bool]]) -> int:
    gate = asyncio.Semaphore(AT_ONCE)

    async def one(a: agent.NodeAgent) -> bool:
        async with gate:
            return await step(a)

    return sum(await asyncio.gather(*(one(a) for a in agents)))


@pytest.mark.parametrize("nodes", [1_000, pytest.param(5_000, marks=pytest.mark.slow)])
async def test_thousands_of_agents_write_only_what_changed(nodes: int, tmp_path: Path) -> None:
    async with Sandbox(nodes=0, kubelet_delay=None, kubeconfig_path=tmp_path / "kubeconfig") as cluster:
        for i in range(nodes):
            cluster.add_node(f"node-{i:04d}", gpus=8)
        clock = Clock()
        config = agent.AgentConfig(interval=30.0, resync=300.0)
        async with await connecting.api_client(str(cluster.kubeconfig)) as client:
            client.rest_client.pool_manager.connector._limit = AT_ONCE
            fakes, agents = _agents(client, clock, config, nodes)
            writes = count_node_writes(cluster)

            assert await _all(agents, lambda a: a.sync()) == nodes  # every node's first publication
            assert writes.total == nodes and set(writes.by_node.values()) == {1}

            clock.now += config.resync  # every agent reads its devices and its Node again: nothing changed
            assert await _all(agents, lambda a: a.sync()) == 0
            assert writes.total == nodes

            rng = random.Random(23)
            ill = rng.sample(range(nodes), 7)
            for i in ill:
                fakes[i].lose(rng.randrange(8))
            assert await _all(agents, lambda a: a.sync()) == 7
            assert {n for n, count in writes.by_node.items() if count == 2} == {f"node-{i:04d}" for i in ill}
            assert writes.total == nodes + 7


def _agents(
    client: k8s.ApiClient, clock: Clock, config: agent.AgentConfig, nodes: int
) -> tuple[list[fakenvml.FakeNvml], list[agent.NodeAgent]]:
    registry = CollectorRegistry()
    writes = publishing.writes_counter(registry)
    models = [servers.DGX_A100, servers.DGX_H100, servers.DGX1_V100, servers.TWO_ISLANDS_8]
    fakes, agents = [], []
    for i in range(nodes):
        fake = fakenvml.FakeNvml(models[i % len(models)])
        source = nvmlsource.NvmlSource(fake)
        source.start()
        api = publishing.NodeApi(client, f"node-{i:04d}", writes)
        fakes.append(fake)
        agents.append(agent.NodeAgent(api, [source], config, clock=clock))
    return fakes, agents
