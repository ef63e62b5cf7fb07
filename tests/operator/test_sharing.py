"""Sharing groups through the operator, seen only through the API (CONTRACT §7)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.operator.kube import Kube, scheduled_condition, selected
from tests.operator.test_scheduling import env_values, status

pytestmark = pytest.mark.usefixtures("operator")

GPU = "nvidia.com/gpu"


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 2, "gpus": 2}


async def declare_memory(kube: Kube, node: str, memory: str) -> None:
    await kube.patch_node(node, {"metadata": {"annotations": {
        "deviceshare.io/device-memory": json.dumps({GPU: memory})}}})


async def test_three_inference_groups_share_one_gpu_by_memory(kube: Kube) -> None:
    await declare_memory(kube, "gpu-node-0", "80Gi")
    await declare_memory(kube, "gpu-node-1", "80Gi")
    await asyncio.sleep(0.3)  # the node watch carries the annotation to the ledger
    share = {GPU: {"compute": "250m", "memory": "20Gi"}}
    for i in range(3):
        await kube.create_group("serving", f"infer-{i}", {GPU: 1}, share=share)
        await kube.create_pod("serving", f"infer-{i}-0", f"infer-{i}")
    pods = [await kube.wait_bound("serving", f"infer-{i}-0") for i in range(3)]
    places = {(p["spec"]["nodeName"], selected(p)[GPU][0]) for p in pods}
    assert len(places) == 1  # binpack: one device, three groups
    device = selected(pods[0])[GPU][0]
    assert all(env_values(p) == {
        "NVIDIA_VISIBLE_DEVICES": device,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M",
    } for p in pods)
    group = await kube.group("serving", "infer-0")
    assert group is not None and status(group)["allocatedDevices"] == {GPU: [device]}


async def test_a_group_that_asks_for_undeclared_memory_stays_pending_and_says_why(kube: Kube) -> None:
    await kube.create_group("lab", "notebook", {GPU: 1}, share={GPU: {"memory": "8Gi"}})
    await kube.create_pod("lab", "nb-0", "notebook")

    async def refused() -> dict[str, Any] | None:
        pod = await kube.pod("lab", "nb-0")
        cond = scheduled_condition(pod) if pod else None
        return cond if cond and cond["status"] == "False" else None

    cond = await kube.wait_for(refused, "nb-0 to be marked unschedulable")
    assert cond["message"] == "0/2 nodes are available: 2 no declared device memory for nvidia.com/gpu."


async def test_two_groups_on_the_tiles_of_one_card(kube: Kube) -> None:
    # gpu-node-0 exposes its two GPUs as cards with two tiles each (as Intel's feature discovery would)
    await kube.patch_node("gpu-node-0", {"metadata": {"annotations": {
        "deviceshare.io/device-tiles": json.dumps({GPU: 2})}}})
    await asyncio.sleep(0.3)
    for name in ("tile-a", "tile-b"):
        await kube.create_group("hpc", name, {GPU: 1}, share={GPU: {"tiles": 1}})
        await kube.create_pod("hpc", f"{name}-0", name)
    pods = [await kube.wait_bound("hpc", f"{n}-0") for n in ("tile-a", "tile-b")]
    assert {p["spec"]["nodeName"] for p in pods} == {"gpu-node-0"}
    groups = [await kube.group("hpc", n) for n in ("tile-a", "tile-b")]
    tiles = sorted(t for g in groups if g for t in status(g)["allocatedTiles"][GPU])
    assert tiles == ["0.0", "0.1"]  # binpack: both tiles of card 0, one group each
    masks = sorted(env_values(p)["NVIDIA_VISIBLE_DEVICES"] for p in pods)
    assert masks == ["0", "0"]
    assert sorted(env_values(p)["ZE_AFFINITY_MASK"] for p in pods) == ["0.0", "0.1"]


async def test_a_released_share_is_given_to_the_next_group(kube: Kube) -> None:
    await declare_memory(kube, "gpu-node-0", "10Gi")
    await declare_memory(kube, "gpu-node-1", "10Gi")
    await asyncio.sleep(0.3)
    big = {GPU: {"memory": "10Gi"}}
    for i in range(4):  # four devices of 10Gi: four groups fit, the fifth waits
        await kube.create_group("ml", f"g{i}", {GPU: 1}, share=big)
        await kube.create_pod("ml", f"p{i}", f"g{i}")
    for i in range(4):
        await kube.wait_bound("ml", f"p{i}")
    await kube.create_group("ml", "late", {GPU: 1}, share={GPU: {"memory": "6Gi"}})
    await kube.create_pod("ml", "late-0", "late")

    async def refused() -> dict[str, Any] | None:
        pod = await kube.pod("ml", "late-0")
        cond = scheduled_condition(pod) if pod else None
        return cond if cond and cond["status"] == "False" else None

    cond = await kube.wait_for(refused, "late-0 to be marked unschedulable")
    assert cond["message"] == "0/2 nodes are available: 2 insufficient nvidia.com/gpu memory."
    await kube.delete_pod("ml", "p0")
    await kube.delete_group("ml", "g0")
    pod = await kube.wait_bound("ml", "late-0", timeout=15)
    assert env_values(pod)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=6144M"


async def test_a_burst_of_notebooks_fills_the_gpus_exactly_and_the_rest_wait(kube: Kube) -> None:
    from tests.reliability import invariants

    # 2 nodes x 2 GPUs, 250m each: sixteen notebooks fit, four do not; all created at once.
    async def one(i: int) -> None:
        await kube.create_group("lab", f"nb{i}", {GPU: 1}, share={GPU: {"compute": "250m"}})
        await kube.create_pod("lab", f"nb{i}-0", f"nb{i}")

    await asyncio.gather(*(one(i) for i in range(20)))

    async def settled() -> list[dict[str, Any]] | None:
        pods = [await kube.pod("lab", f"nb{i}-0") for i in range(20)]
        bound = [p for p in pods if p and p["spec"].get("nodeName")]
        refused = [p for p in pods if p and (scheduled_condition(p) or {}).get("status") == "False"]
        return bound if len(bound) == 16 and len(refused) == 4 else None

    bound = await kube.wait_for(settled, "16 notebooks bound and 4 refused", timeout=20)
    per_device: dict[tuple[str, str], int] = {}
    for p in bound:
        key = (p["spec"]["nodeName"], selected(p)[GPU][0])
        per_device[key] = per_device.get(key, 0) + 1
        assert env_values(p)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert sorted(per_device.values()) == [4, 4, 4, 4]
    invariants.assert_no_double_allocation(await invariants.from_api(kube))
    waiting = [await kube.pod("lab", f"nb{i}-0") for i in range(20)]
    messages = {(scheduled_condition(p) or {}).get("message") for p in waiting if p and not p["spec"].get("nodeName")}
    assert messages == {"0/2 nodes are available: 2 insufficient nvidia.com/gpu compute."}
