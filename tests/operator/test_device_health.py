"""A GPU falls ill under a running group (CONTRACT §9): the agent publishes it, the operator marks the group
``DeviceUnhealthy`` with an event, evicts nothing, and gives the device to nobody new; /metrics counts it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from deviceshare.api import names
from deviceshare.nodeagent import xids
from deviceshare.sandbox import Sandbox
from tests.nodeagent import servers
from tests.operator.conftest import operator_config, start_operator
from tests.operator.kube import Kube
from tests.operator.test_node_facts import GPU, NS, _devices, _place


def _condition(group: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (group.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


@pytest.mark.parametrize("sandbox_options", [{"nodes": 1, "gpus": 8}])
async def test_a_holder_shows_device_unhealthy_keeps_its_pod_and_nobody_new_gets_the_device(
    cluster: Sandbox, kube: Kube, publish: Any, sandbox_options: dict[str, int]
) -> None:
    node = await publish("gpu-node-0", servers.DGX_A100, interval=3600.0)
    running = await start_operator(operator_config(cluster, metrics_port=0, metrics_host="127.0.0.1"))
    watch = xids.XidWatch(node.nvml, node.agent.mark_unhealthy)
    watch.start()
    stop = asyncio.Event()
    agent_loop = asyncio.create_task(node.agent.run(stop))
    try:
        await _place(kube, "holder", 2)
        holder = await kube.wait_group(NS, "holder", lambda g: bool(_devices(g)), "placed")
        await kube.wait_bound(NS, "holder-0")
        held = _devices(holder)
        index = [node.nvml.uuid_at(i) for i in range(8)].index(held[1])
        free = next(i for i in range(8) if node.nvml.uuid_at(i) not in held)
        node.nvml.xid(index, 79)  # "GPU has fallen off the bus" on a device the group holds
        node.nvml.xid(free, 48)  # a double-bit ECC error on a free one
        await kube.wait_for(lambda: _published_ill(cluster) == 2, "both GPUs published unhealthy")

        sick = await kube.wait_group(NS, "holder", lambda g: _condition(g, "DeviceUnhealthy") is not None,
                                     "DeviceUnhealthy")
        condition = _condition(sick, "DeviceUnhealthy")
        assert condition is not None and condition["status"] == "True"
        assert f"node gpu-node-0 reports nvidia.com/gpu {held[1]} unhealthy" in condition["message"]
        assert sick["status"]["phase"] == names.PHASE_BOUND and _devices(sick) == held
        events = await kube.wait_for(
            lambda: _reasons(kube, "holder"), "a DeviceUnhealthy event")
        assert "DeviceUnhealthy" in events
        pod = await kube.pod(NS, "holder-0")
        assert pod is not None and pod["spec"]["nodeName"] == "gpu-node-0"
        assert "deletionTimestamp" not in pod["metadata"]  # not evicted

        # 8 GPUs: 2 held, 1 free but ill, so 5 are left for anyone new: 6 do not fit, 5 do, without the ill one.
        await _place(kube, "six", 6)
        message = await kube.wait_for(lambda: _refusal(kube, "six-0"), "six refused")
        assert message == "0/1 nodes are available: 1 insufficient nvidia.com/gpu."
        await _place(kube, "five", 5)
        five = await kube.wait_group(NS, "five", lambda g: bool(_devices(g)), "placed")
        assert node.nvml.uuid_at(free) not in _devices(five)

        port = running.memo.metrics_server.port
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as resp:
            text = await resp.text()
        assert 'deviceshare_devices_unhealthy{node="gpu-node-0",resource="nvidia.com/gpu"} 2.0' in text
        assert "deviceshare_groups_on_unhealthy_devices 1.0" in text
        assert 'deviceshare_devices_free{node="gpu-node-0",resource="nvidia.com/gpu"} 0.0' in text
    finally:
        stop.set()
        await agent_loop
        watch.stop()
        await running.stop()


def _published_ill(cluster: Sandbox) -> int:
    raw = ((cluster.get("nodes", "gpu-node-0") or {})["metadata"].get("annotations") or {}).get(
        names.NODE_HEALTH_ANNOTATION)
    return len(json.loads(raw)[GPU]) if raw else 0


async def _reasons(kube: Kube, involved: str) -> set[str]:
    return {e.get("reason") for e in await kube.events(NS, involved)}


async def _refusal(kube: Kube, pod_name: str) -> str | None:
    pod = await kube.pod(NS, pod_name)
    for c in ((pod or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return str(c.get("message"))
    return None
