"""Pods and groups come on separate watches, so a pod can reach the operator before its group does.

The webhook admitted the pod because the group exists; the operator must not call it unschedulable
(a FailedScheduling event and a PodScheduled=False condition on a healthy pod) just because its group
watch is behind: it reads the group from the API instead.
"""

from __future__ import annotations

import asyncio
from typing import Any

from deviceshare.api import names
from tests.operator.conftest import operator_config
from tests.reliability import workload
from tests.reliability.conftest import kill, launch

NS = "order"


async def test_a_pod_seen_before_its_group_is_placed_without_a_failed_scheduling(cluster: Any) -> None:
    workload.ensure_namespace(cluster, NS)
    running = await launch(operator_config(cluster))
    try:
        cluster.create(workload.group_body(NS, "warm", {workload.GPU: 1}))
        cluster.create(workload.pod_body(NS, "warm-0", "warm"))
        await workload.until(lambda: workload.bound_pods(cluster, NS), "the operator warmed up")
        # The group watch reconnects slowly; the pod watch at once.
        cluster.inject_fault("GET", rf"^/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL}$", delay=5.0, times=1)
        cluster.drop_watches()
        await asyncio.sleep(0.3)
        cluster.create(workload.group_body(NS, "late", {workload.GPU: 1}))
        cluster.create(workload.pod_body(NS, "late-0", "late"))
        await workload.until(
            lambda: len(workload.bound_pods(cluster, NS)) == 2, "late-0 bound before its group's watch event", 4
        )

        def reasons() -> set[str]:
            return {e["reason"] for e in cluster.list("events", NS) if e["involvedObject"]["name"] == "late-0"}

        await workload.until(lambda: "Scheduled" in reasons(), "the Scheduled event")
        assert "FailedScheduling" not in reasons(), reasons()
    finally:
        cluster.clear_faults()
        await kill(running)
