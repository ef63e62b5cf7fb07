"""Two replicas electing a leader on a Lease: the leader dies, is cut off, or loses its Lease; no double allocation.

The failure to avoid is Koordinator issue 1289: a new leader scheduling from a stale cache and handing
out devices the old leader had just given away. Here the standby rebuilds from the API after it acquires
the Lease (which it can only do once the old leader's has expired) and must continue without a double
allocation. A leader that cannot renew stops placing within its renew deadline, before its Lease can
expire. The timings are client-go's scaled down (lease 4 s, renew deadline 3 s, retry 0.5 s).
"""

from __future__ import annotations

import asyncio
import datetime
import time
from typing import Any

import pytest

from deviceshare.api import names
from tests.operator.conftest import operator_config
from tests.reliability import invariants, workload
from tests.reliability.conftest import Replica, Watchdog, kill, launch

NS = "ha"
LEASE = "deviceshare-operator"
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 4.0, 3.0, 0.5


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 1, "gpus": 4}


def lease(cluster: Any) -> dict[str, Any]:
    return dict((cluster.get("leases", LEASE, names.DEFAULT_NAMESPACE) or {}).get("spec") or {})


def holder(cluster: Any) -> str | None:
    return lease(cluster).get("holderIdentity") or None


async def replica(cluster: Any, identity: str) -> Replica:
    return await launch(operator_config(
        cluster, lease_name=LEASE, identity=identity,
        lease_duration=LEASE_DURATION, renew_deadline=RENEW_DEADLINE, retry_period=RETRY_PERIOD,
    ))


def setup(cluster: Any) -> None:
    workload.ensure_namespace(cluster, NS)
    workload.ensure_namespace(cluster, names.DEFAULT_NAMESPACE)


async def leader_and_standby(cluster: Any) -> tuple[Replica, Replica]:
    first = await replica(cluster, "replica-a")
    await workload.until(lambda: holder(cluster) == "replica-a", "the first replica leads")
    second = await replica(cluster, "replica-b")
    await workload.until(lambda: first.runtime is not None and first.runtime.scheduling, "the leader schedules")
    return first, second


async def test_the_standby_takes_over_mid_placement_without_double_allocation(
    cluster: Any, watchdog: Watchdog
) -> None:
    setup(cluster)
    active, standby = await leader_and_standby(cluster)
    try:
        cluster.create(workload.group_body(NS, "first", {workload.GPU: 2}))
        cluster.create(workload.pod_body(NS, "first-0", "first"))
        first = await workload.until(lambda: workload.bound_pods(cluster, NS), "the active replica schedules")

        # The active replica dies while its next binding is in flight.
        fault = cluster.inject_fault("POST", rf"/namespaces/{NS}/pods/second-0/binding$", delay=0.5)
        cluster.create(workload.group_body(NS, "second", {workload.GPU: 2}, share={workload.GPU: {"compute": "600m"}}))
        cluster.create(workload.pod_body(NS, "second-0", "second"))
        await workload.until(lambda: fault.fired, "the binding of second-0 in flight", 10, 0.005)
        # A killed process writes nothing more; in-process, Kopf still runs its clean-up on cancellation,
        # which would release the Lease, so the API refuses that write.
        dead = cluster.inject_fault("PUT", rf"/leases/{LEASE}$", status=503, times=None)
        killed = time.monotonic()  # no renewal lands after this; the kill itself may take seconds to join
        await kill(active)
        dead.times = 0
        assert holder(cluster) == "replica-a"  # the standby must wait the Lease out

        # The standby acquires the expired Lease, rebuilds from the API (the share of "second" from its
        # spec) and finishes: a partner sharing the rest of second's GPUs fits; then the node (4 GPUs) is full.
        cluster.create(workload.pod_body(NS, "second-1", "second"))
        cluster.create(workload.pod_body(NS, "first-1", "first"))
        cluster.create(workload.group_body(NS, "partner", {workload.GPU: 2}, share={workload.GPU: {"compute": "400m"}}))
        cluster.create(workload.pod_body(NS, "partner-0", "partner"))
        cluster.create(workload.group_body(NS, "third", {workload.GPU: 1}))
        cluster.create(workload.pod_body(NS, "third-0", "third"))
        await workload.until(lambda: len(workload.bound_pods(cluster, NS)) == 5, "the standby bound the rest")
        assert holder(cluster) == "replica-b" and lease(cluster)["leaseTransitions"] == 1
        assert time.monotonic() - killed >= LEASE_DURATION - RETRY_PERIOD, "took over an unexpired Lease"
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


async def test_two_replicas_started_at_the_same_moment_exactly_one_leads(
    cluster: Any, watchdog: Watchdog
) -> None:
    setup(cluster)
    replicas = list(await asyncio.gather(replica(cluster, "replica-0"), replica(cluster, "replica-1")))
    try:
        await workload.until(lambda: holder(cluster), "one replica holds the Lease")
        cluster.create(workload.group_body(NS, "g", {workload.GPU: 2}))
        cluster.create(workload.pod_body(NS, "g-0", "g"))
        await workload.until(lambda: workload.bound_pods(cluster, NS), "the leader schedules")
        await asyncio.sleep(3 * RETRY_PERIOD)  # several election rounds: nobody flips
        scheduling = [r.config.identity for r in replicas if r.runtime is not None and r.runtime.scheduling]
        assert scheduling == [holder(cluster)]
        # The leader stops gracefully: it releases the Lease and the other takes over at once.
        leader = next(r for r in replicas if r.config.identity == holder(cluster))
        other = next(r for r in replicas if r is not leader)
        started = time.monotonic()
        await leader.stop()
        cluster.create(workload.pod_body(NS, "g-1", "g"))
        await workload.until(lambda: len(workload.bound_pods(cluster, NS)) == 2, "the other schedules")
        assert holder(cluster) == other.config.identity
        assert time.monotonic() - started < LEASE_DURATION, "the successor waited for expiry: no release"
    finally:
        for r in replicas:
            if r.alive:
                await kill(r)


async def test_a_partitioned_leader_stops_placing_within_its_renew_deadline(
    cluster: Any, watchdog: Watchdog
) -> None:
    setup(cluster)
    active, standby = await leader_and_standby(cluster)
    try:
        cluster.create(workload.group_body(NS, "g", {workload.GPU: 2}))
        cluster.create(workload.pod_body(NS, "g-0", "g"))
        await workload.until(lambda: workload.bound_pods(cluster, NS), "the leader schedules")
        # The API refuses every write to the Lease, as if the leader were cut off from it.
        cluster.inject_fault("PUT", rf"/leases/{LEASE}$", status=503, times=None)
        cut = time.monotonic()
        await workload.until(lambda: not active.runtime.scheduling, "the leader stops", RENEW_DEADLINE + 3)
        assert time.monotonic() - cut <= RENEW_DEADLINE + 0.5  # its last renewal landed before the cut
        # Nobody may place now: the leader has stopped and the standby cannot take the Lease.
        cluster.create(workload.pod_body(NS, "g-1", "g"))
        await asyncio.sleep(LEASE_DURATION + 1)
        assert len(workload.bound_pods(cluster, NS)) == 1
        assert not standby.runtime.scheduling
        # The partition heals: one replica leads again, rebuilds, and places the waiting pod.
        cluster.clear_faults()
        await workload.until(lambda: len(workload.bound_pods(cluster, NS)) == 2, "a leader places again")
        invariants.assert_no_double_allocation(invariants.from_sandbox(cluster))
    finally:
        for r in (active, standby):
            await kill(r)


async def test_a_leader_whose_lease_is_taken_stops_placing_within_its_renew_deadline(
    cluster: Any, watchdog: Watchdog
) -> None:
    setup(cluster)
    active, standby = await leader_and_standby(cluster)
    try:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        cluster.patch("leases", LEASE, {"spec": {"holderIdentity": "intruder", "renewTime": now}},
                      names.DEFAULT_NAMESPACE)
        taken = time.monotonic()
        await workload.until(lambda: not active.runtime.scheduling, "the leader stops", RENEW_DEADLINE + 3)
        assert time.monotonic() - taken <= RENEW_DEADLINE
        cluster.create(workload.group_body(NS, "g", {workload.GPU: 2}))
        cluster.create(workload.pod_body(NS, "g-0", "g"))
        await asyncio.sleep(1.0)
        assert workload.bound_pods(cluster, NS) == [], "a replica placed while another held the Lease"
        # The intruder never renews: once its Lease expires a replica takes over and places the pod.
        await workload.until(lambda: workload.bound_pods(cluster, NS), "a replica takes over")
        assert holder(cluster) in {"replica-a", "replica-b"}
    finally:
        for r in (active, standby):
            await kill(r)
