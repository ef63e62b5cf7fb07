"""Restarts, conflicting claims and lost nodes: the ledger is rebuilt from the API and never double-books."""

from __future__ import annotations

from typing import Any

from deviceshare.api import names
from tests.operator.conftest import operator_config, start_operator
from tests.operator.kube import Kube, selected

GPU = "nvidia.com/gpu"


def conditions(group: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (group.get("status") or {}).get("conditions", [])}


async def write_status(kube: Kube, ns: str, name: str, status: dict[str, Any]) -> None:
    await kube.custom.patch_namespaced_custom_object_status(
        names.GROUP, names.VERSION, ns, names.PLURAL, name, {"status": status},
        _content_type="application/merge-patch+json", _preload_content=False,
    )


async def test_a_restarted_operator_keeps_every_allocation(cluster: Any, kube: Kube) -> None:
    first = await start_operator(operator_config(cluster))
    for i in range(6):
        await kube.create_group("r", f"g{i}", {GPU: 4})
        await kube.create_pod("r", f"p{i}", f"g{i}")
    before = [await kube.wait_bound("r", f"p{i}") for i in range(6)]
    await first.stop()

    second = await start_operator(operator_config(cluster))
    try:
        for i in range(6, 8):
            await kube.create_group("r", f"g{i}", {GPU: 4})
            await kube.create_pod("r", f"p{i}", f"g{i}")
        after = [await kube.wait_bound("r", f"p{i}") for i in range(6, 8)]
        held = [(p["spec"]["nodeName"], d) for p in before + after for d in selected(p)[GPU]]
        assert len(held) == 32 == len(set(held))
    finally:
        await second.stop()


async def test_devices_claimed_twice_are_reported_on_both_groups_and_given_to_no_third(
    cluster: Any, kube: Kube
) -> None:
    node = sorted(n["metadata"]["name"] for n in cluster.list("nodes"))[0]
    for name in ("a", "b"):
        await kube.create_group("c", name, {GPU: 2})
        await write_status(kube, "c", name, {"phase": "Bound", "nodeName": node, "allocatedDevices": {GPU: ["0", "1"]}})

    running = await start_operator(operator_config(cluster))
    try:
        for name, other in (("a", "c/b"), ("b", "c/a")):
            group = await kube.wait_group("c", name, lambda g: "DeviceConflict" in conditions(g), "DeviceConflict")
            assert conditions(group)["DeviceConflict"]["status"] == "True"
            assert other in conditions(group)["DeviceConflict"]["message"]
            assert any(e["reason"] == "DeviceConflict" for e in await kube.events("c", name))
        # What DeviceshareDeviceClaimedTwice alerts on.
        assert 'deviceshare_groups_in_conflict 2.0' in running.memo.runtime.ctx.metrics.exposition().decode()

        # A third group pinned to that node gets the six other devices, never 0 or 1.
        await kube.patch_node(node, {"metadata": {"labels": {"pin": "here"}}})
        await kube.create_group("c", "third", {GPU: 6}, nodeSelector={"pin": "here"})
        await kube.create_pod("c", "third", "third")
        pod = await kube.wait_bound("c", "third")
        assert set(selected(pod)[GPU]) == {"2", "3", "4", "5", "6", "7"}
        # And a pod joining a conflicted group is held back with the reason.
        await kube.create_pod("c", "joiner", "a")
        await kube.wait_for(
            lambda: _message_contains(kube, "c", "joiner", "also claimed by c/b"), "joiner refused"
        )
    finally:
        await running.stop()


async def _message_contains(kube: Kube, ns: str, name: str, text: str) -> bool:
    pod = await kube.pod(ns, name)
    for c in (pod or {}).get("status", {}).get("conditions", []) or []:
        if c.get("type") == "PodScheduled" and text in c.get("message", ""):
            return True
    return False


async def test_a_lost_node_releases_devices_only_once_no_member_runs_there(cluster: Any, kube: Kube) -> None:
    running = await start_operator(operator_config(cluster))
    try:
        await kube.create_group("n", "g", {GPU: 2})
        await kube.create_pod("n", "p", "g")
        node = (await kube.wait_bound("n", "p"))["spec"]["nodeName"]

        # NotReady with a member still running: NodeLost, but the devices stay held.
        await kube.core.patch_node_status(
            node, {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletDown"}]}},
            _content_type="application/strategic-merge-patch+json", _preload_content=False,
        )
        group = await kube.wait_group("n", "g", lambda g: "NodeLost" in conditions(g), "NodeLost")
        assert group["status"]["phase"] == "Bound"
        assert group["status"]["nodeName"] == node

        # The member finishes: the devices go back and the group waits to be placed again.
        cluster.complete_pod("n", "p")
        group = await kube.wait_group("n", "g", lambda g: g["status"].get("phase") == "Pending", "Pending again")
        assert "allocatedDevices" not in group["status"]
        assert any(e["reason"] == "NodeLost" for e in await kube.events("n", "g"))

        await kube.create_pod("n", "p2", "g")
        assert (await kube.wait_bound("n", "p2"))["spec"]["nodeName"] != node
    finally:
        await running.stop()


async def test_metrics_are_served(cluster: Any, kube: Kube) -> None:
    import aiohttp

    running = await start_operator(operator_config(cluster, metrics_port=0, metrics_host="127.0.0.1"))
    try:
        await kube.create_group("m", "g", {GPU: 1})
        await kube.create_pod("m", "p", "g")
        await kube.wait_bound("m", "p")
        port = await kube.wait_for(lambda: _metrics_port(running), "metrics server")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                assert resp.status == 200
            async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                text = await resp.text()
        assert 'deviceshare_placements_total{result="bound"} 1.0' in text
        assert "deviceshare_devices_allocated{" in text
        assert "deviceshare_placement_duration_seconds_bucket" in text
    finally:
        await running.stop()


def _metrics_port(running: Any) -> int | None:
    server = getattr(running.memo, "metrics_server", None)
    return server.port if server is not None else None


async def test_a_pod_deleted_mid_placement_leaves_nothing_allocated(cluster: Any, kube: Kube) -> None:
    running = await start_operator(operator_config(cluster))
    try:
        # Hold the first member's binding (which carries its annotations) while the pod is deleted under
        # it: by then the group's status already records the allocation (it is written first).
        binding = cluster.inject_fault("POST", r"/namespaces/mid/pods/first/binding$", hold=True)
        await kube.create_group("mid", "g", {GPU: 8})
        await kube.create_pod("mid", "first", "g")
        await kube.wait_for(lambda: binding.fired, "the binding in flight")
        assert (await kube.group("mid", "g") or {})["status"]["phase"] == "Bound"
        await kube.delete_pod("mid", "first")
        binding.release()
        await kube.wait_for(lambda: binding.answered, "the binding answered")
        assert binding.answered == [404]  # it reached a pod already gone

        group = await kube.wait_group(
            "mid", "g", lambda g: (g.get("status") or {}).get("phase") == "Pending", "rolled back to Pending"
        )
        assert "allocatedDevices" not in group["status"] and "nodeName" not in group["status"]
        # (Its Scheduled condition says RolledBack until the next reconcile says WaitingForMembers.)
        assert conditions(group)["Scheduled"]["status"] == "False"

        # Nothing leaked: four 8-GPU groups still fill all four nodes.
        for i in range(4):
            await kube.create_group("mid", f"full{i}", {GPU: 8})
            await kube.create_pod("mid", f"full{i}", f"full{i}")
        nodes = {(await kube.wait_bound("mid", f"full{i}"))["spec"]["nodeName"] for i in range(4)}
        assert len(nodes) == 4
    finally:
        await running.stop()
