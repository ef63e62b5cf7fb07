"""Preemption end to end (CONTRACT §8): a high-priority group makes room by evicting the cheapest lower-priority
groups through the Eviction API, PodDisruptionBudgets hold, the room is kept for it, and the watchdog checks that
no device is ever held by two groups meanwhile.

Two nodes of four GPUs; PriorityClasses low (10), mid (20) and high (1000) set ``spec.priority`` on the pods
through the API server's Priority admission, as on a real cluster.
"""

from __future__ import annotations

from typing import Any

import pytest

from deviceshare.api import names
from deviceshare.cli import explain, inspect
from deviceshare.sandbox import Sandbox
from tests.operator.conftest import operator_config, start_operator
from tests.operator.kube import Kube
from tests.reliability.conftest import Watchdog

GPU = "nvidia.com/gpu"
NS = "prio"


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 2, "gpus": 4}


async def classes(kube: Kube) -> None:
    for name, value in (("low", 10), ("mid", 20), ("high", 1000)):
        await kube.create_priority_class(name, value)


async def member(kube: Kube, group: str, gpus: int, priority_class: str, pod: str | None = None) -> None:
    await kube.create_group(NS, group, {GPU: gpus})
    await kube.create_pod(NS, pod or f"{group}-0", group, priority_class=priority_class)


def scheduled(group: dict[str, Any] | None) -> dict[str, Any]:
    conditions = ((group or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Scheduled"), {})


async def reasons(kube: Kube, involved: str) -> set[str]:
    return {e["reason"] for e in await kube.events(NS, involved)}


async def test_a_high_priority_group_evicts_the_cheapest_victims_and_takes_their_devices(
    cluster: Sandbox, kube: Kube, watchdog: Watchdog
) -> None:
    operator = await start_operator(operator_config(cluster))
    try:
        await classes(kube)
        for group, gpus, level in (("a", 2, "low"), ("b", 2, "low"), ("c", 4, "mid")):
            await member(kube, group, gpus, level)
            await kube.wait_bound(NS, f"{group}-0")
        before = {g: (await kube.group(NS, g))["status"] for g in ("a", "b", "c")}
        assert before["a"]["nodeName"] == before["b"]["nodeName"] != before["c"]["nodeName"]

        await member(kube, "urgent", 2, "high")
        urgent = await kube.wait_bound(NS, "urgent-0")

        # The cheapest set: one low group (not both, not the mid one), the first by name on a tie.
        assert urgent["spec"]["nodeName"] == before["a"]["nodeName"]
        assert await kube.pod(NS, "a-0") is None
        a = await kube.group(NS, "a")
        assert a["status"]["phase"] == "Pending" and not a["status"].get("allocatedDevices")
        assert scheduled(a)["reason"] == "Preempted"
        assert scheduled(a)["message"] == f"preempted by {NS}/urgent (priority 1000) on {before['a']['nodeName']}"
        for untouched in ("b", "c"):
            assert (await kube.group(NS, untouched))["status"]["allocatedDevices"] == before[untouched][
                "allocatedDevices"]
            assert (await kube.pod(NS, f"{untouched}-0"))["spec"]["nodeName"]
        got = (await kube.group(NS, "urgent"))["status"]
        assert got["allocatedDevices"] == before["a"]["allocatedDevices"]
        assert not got.get("nominatedNodeName")  # cleared once bound
        assert "Preempting" in await reasons(kube, "urgent")
        assert "Preempted" in await reasons(kube, "a") and "Preempted" in await reasons(kube, "a-0")
        registry = operator.memo.runtime.ctx.metrics.registry
        assert registry.get_sample_value("deviceshare_preemptions_total", {"result": "evicted"}) == 1
        assert registry.get_sample_value("deviceshare_preemption_victims_total") == 1
    finally:
        await operator.stop()


async def test_a_disruption_budget_protects_its_group_and_the_next_victim_is_chosen(
    cluster: Sandbox, kube: Kube, watchdog: Watchdog
) -> None:
    operator = await start_operator(operator_config(cluster))
    try:
        await classes(kube)
        for group, gpus, level in (("a", 2, "low"), ("b", 2, "low"), ("c", 4, "mid")):
            await member(kube, group, gpus, level)
            await kube.wait_bound(NS, f"{group}-0")
        cluster.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                        "metadata": {"name": "keep-a", "namespace": NS},
                        "spec": {"minAvailable": 1, "selector": {"matchLabels": {names.POD_GROUP_LABEL: "a"}}}})
        await kube.wait_for(
            lambda: ((cluster.get("poddisruptionbudgets", "keep-a", NS) or {}).get("status") or {})
            .get("currentHealthy") == 1, "the budget counted",
        )
        b_devices = (await kube.group(NS, "b"))["status"]["allocatedDevices"]

        await member(kube, "urgent", 2, "high")
        urgent = await kube.wait_bound(NS, "urgent-0")

        assert (await kube.pod(NS, "a-0"))["spec"]["nodeName"], "the budget did not protect a"
        assert (await kube.group(NS, "a"))["status"]["phase"] == "Bound"
        assert await kube.pod(NS, "b-0") is None
        assert (await kube.group(NS, "urgent"))["status"]["allocatedDevices"] == b_devices
        assert urgent["metadata"]["annotations"][names.POD_SELECTED_DEVICES_ANNOTATION]
        registry = operator.memo.runtime.ctx.metrics.registry
        assert registry.get_sample_value("deviceshare_preemptions_total", {"result": "refused"}) == 1
        assert registry.get_sample_value("deviceshare_preemptions_total", {"result": "evicted"}) == 1
    finally:
        await operator.stop()


async def test_the_room_kept_for_a_nominee_is_not_taken_by_an_equal_priority_group(
    cluster: Sandbox, kube: Kube, watchdog: Watchdog
) -> None:
    operator = await start_operator(operator_config(cluster))
    try:
        await classes(kube)
        await member(kube, "a", 4, "low")
        await member(kube, "c", 4, "high")
        for pod in ("a-0", "c-0"):
            await kube.wait_bound(NS, pod)
        node = (await kube.group(NS, "a"))["status"]["nodeName"]
        stopped = cluster.kubelet.slow_to_stop(NS, "a-0")  # a's pod takes its time to stop once evicted

        await member(kube, "urgent", 4, "high")
        nominated = await kube.wait_group(
            NS, "urgent", lambda g: (g.get("status") or {}).get("nominatedNodeName") == node, "nominated"
        )
        assert scheduled(nominated)["reason"] == "Preempting"
        assert (await kube.pod(NS, "a-0"))["metadata"].get("deletionTimestamp")  # evicted, still stopping
        said = await explain.run_async(str(cluster.kubeconfig), NS, "urgent-0")
        assert any(f"being evicted to make room (nominated node {node})" in line for line in said), said
        _, waiting_groups = await inspect.inspect(str(cluster.kubeconfig))
        assert (f"{NS}/urgent", "Preempting", node) in {(w.ref, w.reason, w.nominated) for w in waiting_groups}
        # An equal-priority group arrives while a leaves: it may not take the room, nor preempt the nominee.
        await member(kube, "rival", 2, "high")
        await kube.wait_for(lambda: _waits(kube, "rival-0"), "the rival told why it waits")

        stopped.set()
        bound = await kube.wait_bound(NS, "urgent-0")
        assert bound["spec"]["nodeName"] == node
        assert not (await kube.pod(NS, "rival-0"))["spec"].get("nodeName")
        assert (await kube.pod(NS, "c-0"))["spec"]["nodeName"]  # equal priority is never preempted
    finally:
        await operator.stop()


async def test_a_group_whose_pods_say_never_does_not_preempt(
    cluster: Sandbox, kube: Kube, watchdog: Watchdog
) -> None:
    operator = await start_operator(operator_config(cluster))
    try:
        await classes(kube)
        for group, gpus in (("a", 4), ("b", 4)):
            await member(kube, group, gpus, "low")
            await kube.wait_bound(NS, f"{group}-0")
        # The policy comes from the class (the Priority admission refuses a pod that sets it otherwise).
        await kube.create_priority_class("high-polite", 1000, preemptionPolicy="Never")
        await kube.create_group(NS, "polite", {GPU: 2})
        await kube.create_pod(NS, "polite-0", "polite", priority_class="high-polite")
        condition = await kube.wait_for(lambda: _waits(kube, "polite-0"), "told why it waits")
        assert condition["message"].endswith("preemption: not eligible due to preemptionPolicy=Never.")
        assert (await kube.pod(NS, "a-0"))["spec"]["nodeName"] and (await kube.pod(NS, "b-0"))["spec"]["nodeName"]
    finally:
        await operator.stop()


async def _waits(kube: Kube, pod: str) -> dict[str, Any] | None:
    body = await kube.pod(NS, pod)
    for c in ((body or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return dict(c)
    return None
