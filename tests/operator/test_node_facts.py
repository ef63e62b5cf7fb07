"""End to end on the sandbox: node agents publish (CONTRACT §9), the real operator places on what they said.

Each node's agent reads a recorded server through the fake NVML and writes its annotations through the API,
as the DaemonSet would; the operator, Kopf and all, sees them as node events.
"""

from __future__ import annotations

import io
from typing import Any

import pytest

from deviceshare.api import names
from deviceshare.cli import explain, inspect
from deviceshare.kube import connecting
from deviceshare.sandbox import Sandbox
from tests.nodeagent import servers
from tests.operator.conftest import operator_config, start_operator
from tests.operator.kube import Kube

GPU = names.NVIDIA_GPU_RESOURCE
NS = "ml"


async def _place(kube: Kube, name: str, count: int, **spec: Any) -> None:
    await kube.create_group(NS, name, {GPU: count}, **spec)
    await kube.create_pod(NS, f"{name}-0", name)


def _devices(group: dict[str, Any]) -> list[str]:
    return list((group.get("status") or {}).get("allocatedDevices", {}).get(GPU, []))


@pytest.mark.parametrize("sandbox_options", [{"nodes": 3, "gpus": 8}])
async def test_ten_four_gpu_groups_on_three_two_island_nodes_each_get_one_island(
    cluster: Sandbox, kube: Kube, publish: Any, sandbox_options: dict[str, int]
) -> None:
    nodes = {f"gpu-node-{i}": await publish(f"gpu-node-{i}", servers.TWO_ISLANDS_8) for i in range(3)}
    running = await start_operator(operator_config(cluster))
    try:
        for i in range(10):
            await _place(kube, f"g{i}", 4)
        placed: dict[str, tuple[str, int]] = {}  # group -> (node, island)

        async def record() -> int:
            for group in await kube.groups():
                name, status = group["metadata"]["name"], group.get("status") or {}
                if status.get("phase") == names.PHASE_BOUND and name not in placed:
                    node = nodes[status["nodeName"]]
                    islands = {node.row(u) // 4 for u in _devices(group)}
                    assert len(islands) == 1, f"{name} got GPUs of two NVLink islands: {_devices(group)}"
                    placed[name] = (status["nodeName"], islands.pop())
            return len(placed)

        await kube.wait_for(lambda: _count(record, 6), "six groups placed")
        assert len(set(placed.values())) == 6  # six islands, one group each
        waiting = [g for g in await kube.groups() if g["metadata"]["name"] not in placed]
        assert len(waiting) == 4
        message = await kube.wait_for(lambda: _unschedulable(kube, waiting[0]["metadata"]["name"]), "a reason")
        assert message == "0/3 nodes are available: 3 insufficient nvidia.com/gpu."

        # What a user sees: inspect lists each group's links, explain the links of a bound pod's group.
        shown = io.StringIO()
        snapshot = await _snapshot(cluster)
        inspect.render_table(inspect.device_map(snapshot.nodes, snapshot.groups), shown)
        assert "4 devices linked NV4 (NVLink), NUMA node" in shown.getvalue()
        bound = next(iter(placed))
        lines = await explain.run_async(str(cluster.kubeconfig), NS, f"{bound}-0")
        assert any("nvidia.com/gpu linked NV4 (worst: NV4 (NVLink))" in line for line in lines), lines

        # As bound groups go, the waiting ones come in, each on one island too.
        for name in list(placed)[:4]:
            await kube.core.delete_namespaced_pod(f"{name}-0", NS, grace_period_seconds=0)
            await kube.custom.delete_namespaced_custom_object(names.GROUP, names.VERSION, NS, names.PLURAL, name)
        await kube.wait_for(lambda: _count(record, 10), "all ten groups placed")
    finally:
        await running.stop()


async def _unschedulable(kube: Kube, group: str) -> str | None:
    pod = await kube.pod(NS, f"{group}-0")
    for c in ((pod or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return str(c.get("message"))
    return None


async def _count(record: Any, n: int) -> bool:
    return bool(await record() >= n)


async def _snapshot(cluster: Sandbox) -> inspect.Snapshot:
    async with await connecting.api_client(str(cluster.kubeconfig)) as api:
        return await inspect.read_snapshot(api, pods=False)


@pytest.mark.parametrize("sandbox_options", [{"nodes": 1, "gpus": 4}])
async def test_a_pair_on_a_two_socket_pcie_node_shares_a_socket(
    cluster: Sandbox, kube: Kube, publish: Any, sandbox_options: dict[str, int]
) -> None:
    node = await publish("gpu-node-0", servers.PCIE_2SOCKET_4)
    running = await start_operator(operator_config(cluster))  # it lists the node as the agent left it
    try:
        await _place(kube, "one", 1)
        one = await kube.wait_group(NS, "one", lambda g: bool(_devices(g)), "placed")
        assert [node.row(u) for u in _devices(one)] == [0]
        await _place(kube, "pair", 2)
        pair = await kube.wait_group(NS, "pair", lambda g: bool(_devices(g)), "placed")
        rows = sorted(node.row(u) for u in _devices(pair))
        assert rows == [2, 3]  # GPU1 and GPU2 would be the next in order, across the sockets
    finally:
        await running.stop()
