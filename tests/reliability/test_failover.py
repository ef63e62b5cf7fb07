"""Two replicas under Kopf peering: the active one dies mid-placement, the standby takes over safely.

The failure to avoid is Koordinator issue 1289: a new leader scheduling from a stale cache and handing
out devices the old leader had just given away. Here the standby rebuilds from the API after it is
elected and must continue without a double allocation. Equal priorities must fail safe: nobody schedules.
Kopf forgets a dead peer once its lifetime (60 s) expires; the tests do what Kopf's cleanup does then,
deleting the dead replica's record from the peering object's status.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from deviceshare.api import names
from tests.operator.conftest import operator_config
from tests.reliability import invariants, workload
from tests.reliability.conftest import Replica, Watchdog, kill, launch

NS = "ha"
PEERING = "deviceshare"
PEERING_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "clusterkopfpeerings.kopf.dev"},
    "spec": {
        "group": "kopf.dev",
        "scope": "Cluster",
        "names": {"kind": "ClusterKopfPeering", "plural": "clusterkopfpeerings", "singular": "clusterkopfpeering"},
        "versions": [{
            "name": "v1", "served": True, "storage": True,
            "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {"status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }},
        }],
    },
}


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 1, "gpus": 4}


def peering_status(cluster: Any) -> dict[str, Any]:
    return dict((cluster.get("clusterkopfpeerings", PEERING) or {}).get("status") or {})


async def replica(cluster: Any, identity: str, priority: int) -> Replica:
    return await launch(
        operator_config(cluster, peering_name=PEERING, priority=priority, identity=identity)
    )


def setup_peering(cluster: Any) -> None:
    cluster.create(PEERING_CRD)
    cluster.create({"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": PEERING}})
    workload.ensure_namespace(cluster, NS)


async def test_the_standby_takes_over_mid_placement_without_double_allocation(
    cluster: Any, watchdog: Watchdog
) -> None:
    setup_peering(cluster)
    active = await replica(cluster, "replica-a", 10)
    standby = await replica(cluster, "replica-b", 5)
    try:
        await workload.until(lambda: {"replica-a", "replica-b"} <= set(peering_status(cluster)), "both peers seen")
        cluster.create(workload.group_body(NS, "first", {workload.GPU: 2}))
        cluster.create(workload.pod_body(NS, "first-0", "first"))
        first = await workload.until(lambda: workload.bound_pods(cluster, NS), "the active replica schedules")

        # The active replica dies while its next binding is in flight.
        fault = cluster.inject_fault("POST", rf"/namespaces/{NS}/pods/second-0/binding$", delay=0.5)
        cluster.create(workload.group_body(NS, "second", {workload.GPU: 2}, share={workload.GPU: {"compute": "600m"}}))
        cluster.create(workload.pod_body(NS, "second-0", "second"))
        await workload.until(lambda: fault.fired, "the binding of second-0 in flight", 10, 0.005)
        await kill(active)
        cluster.patch("clusterkopfpeerings", PEERING, {"status": {"replica-a": None}}, subresource="status")

        # The standby rebuilds from the API (the share of "second" from its spec) and finishes: a partner
        # sharing the rest of second's GPUs fits; then the node (4 GPUs) is full.
        cluster.create(workload.pod_body(NS, "second-1", "second"))
        cluster.create(workload.pod_body(NS, "first-1", "first"))
        cluster.create(workload.group_body(NS, "partner", {workload.GPU: 2}, share={workload.GPU: {"compute": "400m"}}))
        cluster.create(workload.pod_body(NS, "partner-0", "partner"))
        cluster.create(workload.group_body(NS, "third", {workload.GPU: 1}))
        cluster.create(workload.pod_body(NS, "third-0", "third"))
        await workload.until(lambda: len(workload.bound_pods(cluster, NS)) == 5, "the standby bound the rest", 20)
        await asyncio.sleep(0.5)
        third = cluster.get("pods", "third-0", NS)
        assert not third["spec"].get("nodeName"), "a fifth device was handed out on a 4-device node"
        partner = cluster.get(names.PLURAL, "partner", NS)["status"]["allocatedDevices"]
        assert partner == cluster.get(names.PLURAL, "second", NS)["status"]["allocatedDevices"]
        snap = invariants.from_sandbox(cluster)
        invariants.assert_no_double_allocation(snap)
        assert invariants.half_bound(snap) == []
        assert cluster.get("pods", "first-0", NS)["metadata"]["annotations"] == first[0]["metadata"]["annotations"]
    finally:
        await kill(standby)


async def test_equal_priorities_fail_safe_and_nobody_schedules(cluster: Any, watchdog: Watchdog) -> None:
    setup_peering(cluster)
    replicas = [await replica(cluster, f"replica-{i}", 7) for i in range(2)]
    try:
        await workload.until(lambda: len(peering_status(cluster)) == 2, "both peers seen")
        cluster.create(workload.group_body(NS, "g", {workload.GPU: 2}))
        cluster.create(workload.pod_body(NS, "g-0", "g"))
        await asyncio.sleep(2.0)  # several leadership polls (1 s each) and the settle time
        assert workload.bound_pods(cluster, NS) == []
        assert not (cluster.get(names.PLURAL, "g", NS).get("status") or {}).get("allocatedDevices")
        # One of them dies: the other is now alone and takes over.
        await kill(replicas[0])
        cluster.patch("clusterkopfpeerings", PEERING, {"status": {"replica-0": None}}, subresource="status")
        await workload.until(lambda: workload.bound_pods(cluster, NS), "the survivor schedules", 15)
    finally:
        for r in replicas:
            if r.alive:
                await kill(r)
