"""Groups sharing devices (CONTRACT §7), end to end on the sandbox: observed only through the API.

The sandbox's GPUs declare 80 GiB each (the ``nvidia.com/gpu.memory`` label, as GPU feature discovery
publishes it). Every test also runs the reliability suite's independent invariant checker, which knows
shares: a device over-committed, or used whole and in parts at once, fails it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from deviceshare.api import names
from deviceshare.sandbox import Sandbox
from tests.operator.conftest import RunningOperator
from tests.operator.kube import Kube, scheduled_condition, selected
from tests.reliability import invariants

pytestmark = pytest.mark.usefixtures("operator")

GPU = "nvidia.com/gpu"
INTEL = "gpu.intel.com/i915"


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 2, "gpus": 2, "intel_nodes": 1}


def env_values(pod: dict[str, Any]) -> dict[str, str]:
    ann = pod["metadata"].get("annotations") or {}
    prefix = names.POD_ENV_ANNOTATION_PREFIX
    return {k[len(prefix):]: v for k, v in ann.items() if k.startswith(prefix)}


async def share_group(kube: Kube, ns: str, name: str, share: dict[str, Any], resource: str = GPU,
                      count: int = 1) -> None:
    await kube.create_group(ns, name, {resource: count}, share={resource: share})
    await kube.create_pod(ns, name, name)


async def pending_message(kube: Kube, ns: str, pod: str) -> str:
    async def unschedulable() -> str | None:
        found = await kube.pod(ns, pod)
        cond = scheduled_condition(found or {})
        return str(cond["message"]) if cond and cond.get("reason") == "Unschedulable" else None

    message: str = await kube.wait_for(unschedulable, f"{ns}/{pod} reported unschedulable")
    return message


def assert_invariant(cluster: Sandbox) -> None:
    invariants.assert_no_double_allocation(invariants.from_sandbox(cluster))


async def test_three_groups_share_one_gpu_by_memory_with_their_limits(kube: Kube, cluster: Sandbox) -> None:
    for name in ("llama", "mistral", "whisper"):
        await share_group(kube, "serving", name, {"memory": "24Gi"})
    pods = [await kube.wait_bound("serving", n) for n in ("llama", "mistral", "whisper")]
    assert len({p["spec"]["nodeName"] for p in pods}) == 1
    assert len({tuple(selected(p)[GPU]) for p in pods}) == 1, "binpack puts the shares on one GPU"
    device = selected(pods[0])[GPU][0]
    for pod in pods:
        assert env_values(pod) == {"NVIDIA_VISIBLE_DEVICES": device, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=24576M"}
    group = await kube.wait_group("serving", "llama", lambda g: g.get("status", {}).get("memberCount") == 1, "bound")
    assert group["status"]["allocatedDevices"] == {GPU: [device]}
    assert "allocatedTiles" not in group["status"]
    scheduled = next(c for c in group["status"]["conditions"] if c["type"] == names.CONDITION_SCHEDULED)
    assert "(memory=24Gi)" in scheduled["message"]

    # A fourth 24Gi share no longer fits beside them (96Gi > 80Gi): it takes the node's other GPU,
    # and a whole-device group then gets neither of the shared GPUs.
    await share_group(kube, "serving", "bert", {"memory": "24Gi"})
    bert = await kube.wait_bound("serving", "bert")
    assert bert["spec"]["nodeName"] == pods[0]["spec"]["nodeName"] and selected(bert)[GPU] != [device]
    await kube.create_group("serving", "trainer", {GPU: 2})
    await kube.create_pod("serving", "trainer", "trainer")
    trainer = await kube.wait_bound("serving", "trainer")
    assert trainer["spec"]["nodeName"] != pods[0]["spec"]["nodeName"]
    assert_invariant(cluster)


async def test_a_share_that_fits_nowhere_waits_with_a_capacity_reason_until_one_is_released(
    kube: Kube, cluster: Sandbox
) -> None:
    for i in range(4):  # one 60Gi share per GPU of the two GPU nodes
        await share_group(kube, "ml", f"big-{i}", {"memory": "60Gi", "compute": "0.5"})
    for i in range(4):
        await kube.wait_bound("ml", f"big-{i}")
    await share_group(kube, "ml", "late", {"memory": "60Gi"})
    message = await pending_message(kube, "ml", "late")
    assert message == (
        "0/3 nodes are available: 1 insufficient nvidia.com/gpu, 2 insufficient nvidia.com/gpu memory."
    )
    group = await kube.wait_group(
        "ml", "late",
        lambda g: any(c.get("reason") == "Unschedulable" for c in g.get("status", {}).get("conditions", [])),
        "Unschedulable",
    )
    assert group["status"]["phase"] == names.PHASE_PENDING
    assert any(e["reason"] == "FailedScheduling" and "insufficient nvidia.com/gpu memory" in e["message"]
               for e in await kube.events("ml", "late"))
    # A compute-only share still fits beside the 0.5 ones: memory is what is short, not compute.
    await share_group(kube, "ml", "small", {"compute": "250m"})
    await kube.wait_bound("ml", "small")

    # Releasing one share gives its room back: the waiting group takes exactly that GPU.
    freed = selected(await kube.wait_bound("ml", "big-2"))
    where = (await kube.pod("ml", "big-2") or {})["spec"]["nodeName"]
    await kube.delete_pod("ml", "big-2")
    await kube.delete_group("ml", "big-2")
    late = await kube.wait_bound("ml", "late")
    assert (late["spec"]["nodeName"], selected(late)) == (where, freed)
    assert_invariant(cluster)


@pytest.mark.parametrize("sandbox_options", [{"nodes": 2, "gpus": 2, "gpu_memory_mib": None}])
async def test_nodes_without_declared_memory_say_so(kube: Kube, cluster: Sandbox) -> None:
    await share_group(kube, "ml", "needs-memory", {"memory": "1Gi"})
    message = await pending_message(kube, "ml", "needs-memory")
    assert "2 no declared device memory for nvidia.com/gpu" in message
    await share_group(kube, "ml", "compute-only", {"compute": "100m"})
    pod = await kube.wait_bound("ml", "compute-only")
    assert env_values(pod)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "10"


async def test_a_burst_of_sharing_groups_never_overcommits(
    kube: Kube, cluster: Sandbox, operator: RunningOperator
) -> None:
    # 4 GPUs x 1000m: three 300m shares per GPU fit, so 12 of 20 groups are placed.
    await asyncio.gather(*(share_group(kube, "burst", f"g{i:02d}", {"compute": "300m"}) for i in range(20)))

    def placed() -> list[dict[str, Any]]:
        return [p for p in cluster.list("pods", "burst") if (p.get("spec") or {}).get("nodeName")]

    await kube.wait_for(lambda: len(placed()) == 12, "12 groups placed")
    # Every one of the 20 decided: the other 8 wait in the scheduler's queue, parked as unschedulable.
    await kube.wait_for(lambda: operator.memo.runtime.queue.parked == 8, "the other 8 parked")
    assert len(placed()) == 12
    per_device: dict[tuple[str, str], int] = {}
    for pod in placed():
        assert env_values(pod)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
        for device in selected(pod)[GPU]:
            key = (pod["spec"]["nodeName"], device)
            per_device[key] = per_device.get(key, 0) + 1
    assert sorted(per_device.values()) == [3, 3, 3, 3]
    waiting = [p["metadata"]["name"] for p in cluster.list("pods", "burst") if p not in placed()]
    message = await pending_message(kube, "burst", waiting[0])
    assert "2 insufficient nvidia.com/gpu compute" in message
    assert_invariant(cluster)


async def test_two_groups_on_the_tiles_of_one_intel_card(kube: Kube, cluster: Sandbox) -> None:
    for name in ("encode", "decode"):
        await share_group(kube, "media", name, {"tiles": 1}, resource=INTEL)
    pods = [await kube.wait_bound("media", n) for n in ("encode", "decode")]
    assert {p["spec"]["nodeName"] for p in pods} == {"intel-node-0"}
    assert selected(pods[0]) == selected(pods[1]) == {INTEL: ["0"]}
    masks = sorted(env_values(p)["ZE_AFFINITY_MASK"] for p in pods)
    assert masks == ["0.0", "0.1"]
    groups = [await kube.group("media", n) for n in ("encode", "decode")]
    assert sorted(t for g in groups for t in (g or {})["status"]["allocatedTiles"][INTEL]) == ["0.0", "0.1"]
    # The card's two tiles are taken: the next tile group goes to the second card, a whole-card group fails.
    await share_group(kube, "media", "third", {"tiles": 2}, resource=INTEL)
    assert selected(await kube.wait_bound("media", "third")) == {INTEL: ["1"]}
    await share_group(kube, "media", "fourth", {"tiles": 1}, resource=INTEL)
    assert "1 insufficient gpu.intel.com/i915 tiles" in await pending_message(kube, "media", "fourth")
    assert_invariant(cluster)
