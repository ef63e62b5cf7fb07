"""Pods and groups come on separate watches, so a pod can reach the operator before its group does.

The webhook admitted the pod because the group exists; the operator must not call it unschedulable
(a FailedScheduling event and a PodScheduled=False condition on a healthy pod) just because its group
watch is behind: it reads the group from the API instead.
"""

from __future__ import annotations

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
        # The group watch's reconnect is held; the pod watch reconnects at once.
        behind = cluster.inject_fault("GET", rf"^/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL}$", hold=True)
        cluster.drop_watches()
        await workload.until(lambda: behind.fired and cluster.open_watches("pods"),
                             "the group watch held, the pod watch back")
        cluster.create(workload.group_body(NS, "late", {workload.GPU: 1}))
        cluster.create(workload.pod_body(NS, "late-0", "late"))
        await workload.until(lambda: len(workload.bound_pods(cluster, NS)) == 2, "late-0 bound")
        assert behind.answered == [], "the group watch caught up first: the pod did not come before its group"
        behind.release()

        def reasons() -> set[str]:
            return {e["reason"] for e in cluster.list("events", NS) if e["involvedObject"]["name"] == "late-0"}

        await workload.until(lambda: "Scheduled" in reasons(), "the Scheduled event")
        assert "FailedScheduling" not in reasons(), reasons()
    finally:
        cluster.clear_faults()
        await kill(running)
