"""The operator places groups and binds their pods, observed only through the API (CONTRACT §1–3)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from deviceshare.api import names
from tests.operator.kube import Kube, scheduled_condition, selected

pytestmark = pytest.mark.usefixtures("operator")

GPU = "nvidia.com/gpu"


def status(group: dict[str, Any]) -> dict[str, Any]:
    return group.get("status") or {}


def env_values(pod: dict[str, Any]) -> dict[str, str]:
    ann = pod["metadata"].get("annotations") or {}
    return {k[len(names.POD_ENV_ANNOTATION_PREFIX):]: v for k, v in ann.items()
            if k.startswith(names.POD_ENV_ANNOTATION_PREFIX)}


async def test_members_of_a_group_share_node_and_devices(kube: Kube) -> None:
    await kube.create_group("ml", "trainer", {GPU: 2})
    for name in ("trainer-0", "trainer-1", "evaluator"):
        await kube.create_pod("ml", name, "trainer")
    pods = [await kube.wait_bound("ml", n) for n in ("trainer-0", "trainer-1", "evaluator")]

    nodes = {p["spec"]["nodeName"] for p in pods}
    devices = [selected(p) for p in pods]
    assert len(nodes) == 1
    assert devices[0] == devices[1] == devices[2]
    assert len(devices[0][GPU]) == 2
    ids = ",".join(devices[0][GPU])
    assert all(env_values(p) == {"NVIDIA_VISIBLE_DEVICES": ids} for p in pods)

    group = await kube.wait_group("ml", "trainer", lambda g: status(g).get("memberCount") == 3, "3 members")
    st = status(group)
    assert st["phase"] == "Bound"
    assert st["nodeName"] == nodes.pop()
    assert st["allocatedDevices"] == {GPU: devices[0][GPU]}
    assert st["members"] == ["evaluator", "trainer-0", "trainer-1"]
    scheduled = next(c for c in st["conditions"] if c["type"] == "Scheduled")
    assert scheduled["status"] == "True"
    assert names.GROUP_FINALIZER in group["metadata"]["finalizers"]
    reasons = {e["reason"] for e in await kube.events("ml", "trainer-0")}
    assert "Scheduled" in reasons
    # Our own fresh annotations must never be mistaken for hand edits.
    assert "DeviceAnnotationsRestored" not in reasons


async def test_groups_never_share_a_device_and_the_overflow_says_why(kube: Kube) -> None:
    # 4 nodes x 8 GPUs = 32 devices: sixteen 2-GPU groups fit exactly, the seventeenth does not.
    for i in range(17):
        await kube.create_group("team", f"g{i}", {GPU: 2})
        await kube.create_pod("team", f"p{i}", f"g{i}")
    bound = await asyncio.gather(*(kube.wait_bound("team", f"p{i}") for i in range(16)))
    held = [(p["spec"]["nodeName"], d) for p in bound for d in selected(p)[GPU]]
    assert len(held) == 32 == len(set(held))

    async def refused() -> dict[str, Any] | None:
        pod = await kube.pod("team", "p16")
        cond = scheduled_condition(pod) if pod else None
        return cond if cond and cond["status"] == "False" else None

    cond = await kube.wait_for(refused, "p16 to be marked unschedulable")
    assert cond["reason"] == "Unschedulable"
    assert cond["message"] == "0/4 nodes are available: 4 insufficient nvidia.com/gpu."
    events = await kube.events("team", "p16")
    assert any(e["reason"] == "FailedScheduling" and "4 insufficient nvidia.com/gpu" in e["message"] for e in events)
    group = await kube.wait_group(
        "team", "g16", lambda g: any(c.get("reason") == "Unschedulable" for c in status(g).get("conditions", [])),
        "Unschedulable condition",
    )
    assert status(group)["phase"] == "Pending"


async def test_pending_pod_is_placed_when_a_group_releases_its_devices(kube: Kube) -> None:
    for i in range(4):
        await kube.create_group("ns", f"big{i}", {GPU: 8})
        await kube.create_pod("ns", f"big{i}", f"big{i}")
    for i in range(4):
        await kube.wait_bound("ns", f"big{i}")
    await kube.create_group("ns", "late", {GPU: 4})
    await kube.create_pod("ns", "late", "late")
    await kube.wait_for(
        lambda: _unschedulable(kube, "ns", "late"), "late to be unschedulable"
    )
    await kube.delete_group("ns", "big0")
    await kube.delete_pod("ns", "big0")
    pod = await kube.wait_bound("ns", "late")
    assert len(selected(pod)[GPU]) == 4
    await kube.wait_for(lambda: _gone(kube, "ns", "big0"), "big0 to be deleted once its pod is gone")


async def _unschedulable(kube: Kube, ns: str, name: str) -> bool:
    pod = await kube.pod(ns, name)
    cond = scheduled_condition(pod) if pod else None
    return bool(cond and cond["status"] == "False")


async def _gone(kube: Kube, ns: str, name: str) -> bool:
    return await kube.group(ns, name) is None


@pytest.mark.parametrize(("strategy", "same_node"), [("binpack", True), ("spread", False)])
async def test_binpack_fills_a_node_spread_uses_the_emptiest(kube: Kube, strategy: str, same_node: bool) -> None:
    await kube.create_group("s", "a", {GPU: 2}, schedulingStrategy=strategy)
    await kube.create_pod("s", "a", "a")
    first = await kube.wait_bound("s", "a")
    await kube.create_group("s", "b", {GPU: 2}, schedulingStrategy=strategy)
    await kube.create_pod("s", "b", "b")
    second = await kube.wait_bound("s", "b")
    assert (first["spec"]["nodeName"] == second["spec"]["nodeName"]) is same_node


async def test_group_and_pod_node_selectors_are_honoured(kube: Kube, cluster: Any) -> None:
    nodes = sorted(n["metadata"]["name"] for n in cluster.list("nodes"))
    await kube.patch_node(nodes[2], {"metadata": {"labels": {"deviceshare.io/gpu-model": "A100"}}})
    await kube.patch_node(nodes[3], {"metadata": {"labels": {"zone": "b"}}})
    await kube.create_group("sel", "a100", {GPU: 1}, nodeSelector={"deviceshare.io/gpu-model": "A100"})
    await kube.create_pod("sel", "on-a100", "a100")
    await kube.create_group("sel", "anywhere", {GPU: 1})
    await kube.create_pod("sel", "in-zone-b", "anywhere", node_selector={"zone": "b"})
    assert (await kube.wait_bound("sel", "on-a100"))["spec"]["nodeName"] == nodes[2]
    assert (await kube.wait_bound("sel", "in-zone-b"))["spec"]["nodeName"] == nodes[3]

    await kube.create_group("sel", "nowhere", {GPU: 1}, nodeSelector={"deviceshare.io/gpu-model": "H100"})
    await kube.create_pod("sel", "stuck", "nowhere")

    async def message() -> str | None:
        pod = await kube.pod("sel", "stuck")
        cond = scheduled_condition(pod) if pod else None
        return cond["message"] if cond and cond["status"] == "False" else None

    assert await kube.wait_for(message, "stuck to be refused") == (
        "0/4 nodes are available: 4 node(s) didn't match group nodeSelector."
    )


async def test_max_members_is_enforced(kube: Kube) -> None:
    await kube.create_group("mm", "duo", {GPU: 1}, maxMembers=2)
    for name in ("a", "b", "c"):
        await kube.create_pod("mm", name, "duo")
    await kube.wait_bound("mm", "a")
    await kube.wait_bound("mm", "b")

    async def refused() -> str | None:
        pod = await kube.pod("mm", "c")
        cond = scheduled_condition(pod) if pod else None
        return cond["message"] if cond and cond["status"] == "False" else None

    assert "maxMembers is 2" in await kube.wait_for(refused, "c refused")
    await kube.delete_pod("mm", "a")
    await kube.wait_bound("mm", "c")


async def test_deleting_a_group_waits_for_its_members(kube: Kube) -> None:
    await kube.create_group("del", "g", {GPU: 8})
    await kube.create_pod("del", "member", "g")
    node = (await kube.wait_bound("del", "member"))["spec"]["nodeName"]
    await kube.delete_group("del", "g")
    group = await kube.wait_group("del", "g", lambda g: status(g).get("phase") == "Releasing", "Releasing")
    assert group["metadata"].get("deletionTimestamp")

    # The devices are still held: a new 8-GPU group pinned to that node cannot be placed there.
    await kube.patch_node(node, {"metadata": {"labels": {"pin": "here"}}})
    await kube.create_group("del", "next", {GPU: 8}, nodeSelector={"pin": "here"})
    await kube.create_pod("del", "next", "next")
    await kube.wait_for(lambda: _unschedulable(kube, "del", "next"), "next to wait for the devices")

    await kube.delete_pod("del", "member")
    await kube.wait_for(lambda: _gone(kube, "del", "g"), "g to be deleted")
    assert (await kube.wait_bound("del", "next"))["spec"]["nodeName"] == node
    reasons = {e["reason"] for e in await kube.events("del", "g")}
    # The placement is told by the group's status (Scheduled=True, reason Bound), not by an event of its own.
    assert "Released" in reasons and "Bound" not in reasons


async def test_pod_without_a_group_or_with_a_missing_group_stays_pending_with_a_reason(kube: Kube) -> None:
    await kube.create_pod("x", "orphan", "no-such-group")
    await kube.create_pod("x", "ungrouped", None)

    async def message(name: str) -> str | None:
        pod = await kube.pod("x", name)
        cond = scheduled_condition(pod) if pod else None
        return cond["message"] if cond and cond["status"] == "False" else None

    assert 'SharedDeviceGroup "no-such-group" not found in namespace "x"' in await kube.wait_for(
        lambda: message("orphan"), "orphan refused"
    )
    assert "device-group annotation" in await kube.wait_for(lambda: message("ungrouped"), "ungrouped refused")
    # Creating the group later places the waiting pod without any other nudge.
    await kube.create_group("x", "no-such-group", {GPU: 1})
    await kube.wait_bound("x", "orphan")


async def test_hand_edited_device_annotations_are_put_back(kube: Kube) -> None:
    await kube.create_group("edit", "g", {GPU: 2})
    await kube.create_pod("edit", "p", "g")
    pod = await kube.wait_bound("edit", "p")
    truth = pod["metadata"]["annotations"][names.POD_SELECTED_DEVICES_ANNOTATION]
    await kube.patch_pod_annotations(
        "edit", "p",
        {names.POD_SELECTED_DEVICES_ANNOTATION: json.dumps({GPU: "6,7"}),
         names.env_annotation("NVIDIA_VISIBLE_DEVICES"): "6,7"},
    )

    async def restored() -> bool:
        p = await kube.pod("edit", "p")
        return bool(p and p["metadata"]["annotations"][names.POD_SELECTED_DEVICES_ANNOTATION] == truth
                    and env_values(p)["NVIDIA_VISIBLE_DEVICES"] == json.loads(truth)[GPU])

    await kube.wait_for(restored, "annotations restored from the group's status")


async def test_a_group_without_pods_says_it_waits_for_members(kube: Kube) -> None:
    """Its first status waits a moment (its pods usually follow and the placement writes it), then says why."""
    await kube.create_group("idle", "lonely", {GPU: 1})
    group = await kube.wait_group(
        "idle", "lonely", lambda g: status(g).get("phase") == names.PHASE_PENDING, "Pending"
    )
    scheduled = next(c for c in status(group)["conditions"] if c["type"] == names.CONDITION_SCHEDULED)
    assert (scheduled["status"], scheduled["reason"]) == ("False", "WaitingForMembers")
    assert status(group)["memberCount"] == 0
    assert names.GROUP_FINALIZER in group["metadata"]["finalizers"]
