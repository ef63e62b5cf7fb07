"""Gang start end to end (CONTRACT §8 ``minMembers``): nothing held until all N pods exist and fit one node.

Through the API only, as a user sees it: the group's ``Scheduled`` condition, the pods' ``PodScheduled``
condition, what a probe group can still get (proof that the waiting gang holds no device), and the
operator's own count of scheduling cycles (all N bound in the cycle of the N-th pod).
"""

from __future__ import annotations

from typing import Any

import pytest

from deviceshare.api import names
from deviceshare.cli import explain, inspect
from deviceshare.sandbox import Sandbox
from tests.operator.conftest import RunningOperator
from tests.operator.kube import Kube, scheduled_condition

GPU = "nvidia.com/gpu"
NS = "train"


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 1, "gpus": 4}


def bound_cycles(operator: RunningOperator) -> float:
    registry = operator.memo.runtime.ctx.metrics.registry
    return registry.get_sample_value("deviceshare_placements_total", {"result": "bound"}) or 0.0


def group_scheduled(group: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in (group.get("status") or {}).get("conditions") or [] if c["type"] == "Scheduled"), {})


async def test_a_gang_holds_nothing_until_its_last_member_and_then_binds_all_in_one_cycle(
    cluster: Sandbox, kube: Kube, operator: RunningOperator
) -> None:
    await kube.create_group(NS, "trainer", {GPU: 2}, minMembers=3)
    for pod in ("trainer-0", "evaluator"):
        await kube.create_pod(NS, pod, "trainer")
    waiting = await kube.wait_group(
        NS, "trainer", lambda g: group_scheduled(g).get("message") == "2/3 member pods exist", "2/3 members",
    )
    assert group_scheduled(waiting)["reason"] == "WaitingForMembers"
    assert not (waiting["status"].get("allocatedDevices") or waiting["status"].get("nodeName"))
    for pod in ("trainer-0", "evaluator"):
        # trainer-0 said 1/3 first, alone; it is told 2/3 in its next cycle, which may come after the group's status.
        got = await kube.wait_for(
            lambda p=pod: _told(kube, p, "2/3 member pods exist"), f"{pod} told why it waits"  # type: ignore[misc]
        )
        assert got["reason"] == "Unschedulable" and not (await kube.pod(NS, pod))["spec"].get("nodeName")

    # explain and inspect say so too.
    said = await explain.run_async(str(cluster.kubeconfig), NS, "evaluator")
    assert "Scheduler says (Unschedulable): 2/3 member pods exist" in said
    assert any("gang (minMembers 3)" in line and "1 more to create" in line for line in said)
    _, waiting_groups = await inspect.inspect(str(cluster.kubeconfig))
    assert [(w.ref, w.reason, w.message) for w in waiting_groups] == [
        (f"{NS}/trainer", "WaitingForMembers", "2/3 member pods exist")]

    # Nothing is held: the node's four GPUs all go to a probe group meanwhile.
    await kube.create_group(NS, "probe", {GPU: 4})
    await kube.create_pod(NS, "probe-0", "probe")
    await kube.wait_bound(NS, "probe-0")
    await kube.delete_pod(NS, "probe-0")
    await kube.delete_group(NS, "probe")
    await kube.wait_for(lambda: _gone(kube, "probe"), "the probe group released and gone")

    before = bound_cycles(operator)
    await kube.create_pod(NS, "logger", "trainer")
    bound = [await kube.wait_bound(NS, p) for p in ("logger", "trainer-0", "evaluator")]
    assert bound_cycles(operator) - before == 1, "the gang was not bound in one scheduling cycle"
    assert len({p["spec"]["nodeName"] for p in bound}) == 1
    devices = {p["metadata"]["annotations"][names.POD_SELECTED_DEVICES_ANNOTATION] for p in bound}
    assert len(devices) == 1
    group = await kube.wait_group(NS, "trainer", lambda g: g["status"].get("memberCount") == 3, "3 members")
    assert group["status"]["phase"] == "Bound" and group_scheduled(group)["reason"] == "Bound"

    # A member that comes after the start joins as any later member does.
    await kube.create_pod(NS, "profiler", "trainer")
    late = await kube.wait_bound(NS, "profiler")
    assert late["metadata"]["annotations"][names.POD_SELECTED_DEVICES_ANNOTATION] in devices


async def test_a_gang_whose_members_cannot_all_fit_one_nodes_cpu_binds_none_and_says_why(
    cluster: Sandbox, kube: Kube, operator: RunningOperator
) -> None:
    cpu = (cluster.get("nodes", "gpu-node-0") or {})["status"]["allocatable"]["cpu"]
    each = f"{int(cpu) * 1000 // 2}m"  # two fit the node's CPU, three do not
    await kube.create_group(NS, "wide", {GPU: 1}, minMembers=3)
    for i in range(3):
        await kube.create_pod(NS, f"wide-{i}", "wide", cpu=each)
    why = "gang of 3 member pods: 0/1 nodes are available: 1 insufficient cpu."
    group = await kube.wait_group(NS, "wide", lambda g: group_scheduled(g).get("message") == why, "told why")
    assert group_scheduled(group)["reason"] == "Unschedulable"
    assert not group["status"].get("allocatedDevices")
    for i in range(3):
        condition = await kube.wait_for(lambda i=i: _unscheduled(kube, f"wide-{i}"), "told why")  # type: ignore[misc]
        assert condition["message"] == why
        assert not (await kube.pod(NS, f"wide-{i}"))["spec"].get("nodeName")
    events = {e["reason"] for e in await kube.events(NS, "wide-0")}
    assert "FailedScheduling" in events
    said = await explain.run_async(str(cluster.kubeconfig), NS, "wide-1")
    assert any("ONE node with room for all 3 pods" in line for line in said)
    assert any("lack the cpu the pod requests" in line for line in said)


async def _unscheduled(kube: Kube, pod: str) -> dict[str, Any] | None:
    body = await kube.pod(NS, pod)
    condition = scheduled_condition(body) if body else None
    return condition if condition is not None and condition.get("status") == "False" else None


async def _told(kube: Kube, pod: str, message: str) -> dict[str, Any] | None:
    condition = await _unscheduled(kube, pod)
    return condition if condition is not None and condition.get("message") == message else None


async def _gone(kube: Kube, group: str) -> bool:
    return await kube.group(NS, group) is None
