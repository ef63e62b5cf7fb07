"""Two replicas electing a leader on a Lease: the leader dies, is cut off, or loses its Lease; no double allocation.

The failure to avoid is Koordinator issue 1289: a new leader scheduling from a stale cache and handing
out devices the old leader had just given away. Here the standby rebuilds from the API after it acquires
the Lease (which it can only do once the old leader's has expired) and must continue without a double
allocation. A leader that cannot renew stops placing, and nobody places until a Lease is held again. The
timings are client-go's scaled down (lease 4 s, renew deadline 3 s, retry 0.5 s).

Every check here is an order of events the API recorded (the sandbox's resourceVersions of the Lease's
records and of each binding, the Lease's own time stamps, the requests a replica sent), never a
wall-clock bound, so a slow machine cannot fail it. How soon a leader stops, to the tenth of a second,
is checked on a controlled clock in tests/operator/test_leadership.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
from typing import Any

import pytest

from deviceshare.api import names
from deviceshare.sandbox import store
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


@dataclasses.dataclass
class History:
    """What the API stored, in resourceVersion order: every Lease record and the version of each binding."""

    leases: list[tuple[int, dict[str, Any]]] = dataclasses.field(default_factory=list)
    bound_at: dict[str, int] = dataclasses.field(default_factory=dict)  # pod -> resourceVersion of its binding

    def __call__(self, event: store.WatchEvent) -> None:
        md = event.obj.get("metadata") or {}
        if event.obj.get("kind") == "Lease" and md.get("name") == LEASE:
            self.leases.append((event.rv, dict(event.obj.get("spec") or {})))
        elif event.obj.get("kind") == "Pod" and (event.obj.get("spec") or {}).get("nodeName"):
            self.bound_at.setdefault(md["name"], event.rv)

    def holders(self) -> list[str]:
        """Who held the Lease, one entry per change of holder ("" for a released Lease)."""
        seen: list[str] = []
        for _, spec in self.leases:
            who = spec.get("holderIdentity") or ""
            if not seen or seen[-1] != who:
                seen.append(who)
        return seen

    def taken_by(self, identity: str) -> tuple[int, dict[str, Any]]:
        """The record in which ``identity`` acquired the Lease (the last time it did)."""
        return next((rv, spec) for rv, spec in reversed(self.leases)
                    if spec.get("holderIdentity") == identity and spec.get("acquireTime") == spec.get("renewTime"))


@pytest.fixture
def history(cluster: Any) -> History:
    recorder = History()
    cluster.store.listeners.append(recorder)
    return recorder


def micro_time(value: str) -> datetime.datetime:
    return datetime.datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ")


def lease_attempts(cluster: Any, identity: str) -> int:
    """PUTs of the Lease naming ``identity`` as holder that reached the API server, answered or refused."""
    return sum(1 for r in cluster.api if str(r.method.value) == "PUT" and r.url.path.endswith(f"/leases/{LEASE}")
               and (json.loads(r.text or "{}").get("spec") or {}).get("holderIdentity") == identity)


def refused(cluster: Any, pod: str) -> bool:
    """The scheduler decided ``pod`` and said why it waits."""
    conditions = ((cluster.get("pods", pod, NS) or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conditions)


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
    cluster: Any, watchdog: Watchdog, history: History
) -> None:
    setup(cluster)
    active, standby = await leader_and_standby(cluster)
    try:
        cluster.create(workload.group_body(NS, "first", {workload.GPU: 2}))
        cluster.create(workload.pod_body(NS, "first-0", "first"))
        first = await workload.until(lambda: workload.bound_pods(cluster, NS), "the active replica schedules")

        # The active replica dies while its next binding is held in flight; the binding then lands.
        fault = cluster.inject_fault("POST", rf"/namespaces/{NS}/pods/second-0/binding$", hold=True)
        cluster.create(workload.group_body(NS, "second", {workload.GPU: 2}, share={workload.GPU: {"compute": "600m"}}))
        cluster.create(workload.pod_body(NS, "second-0", "second"))
        await workload.until(lambda: fault.fired, "the binding of second-0 in flight")
        await kill(active)  # its connections cut first: no clean-up releases the Lease, as with SIGKILL
        fault.release()
        await workload.until(lambda: fault.answered, "the dead leader's binding answered")

        # The standby acquires the expired Lease, rebuilds from the API (the share of "second" from its
        # spec) and finishes: a partner sharing the rest of second's GPUs fits; then the node (4 GPUs) is full.
        cluster.create(workload.pod_body(NS, "second-1", "second"))
        cluster.create(workload.pod_body(NS, "first-1", "first"))
        cluster.create(workload.group_body(NS, "partner", {workload.GPU: 2}, share={workload.GPU: {"compute": "400m"}}))
        cluster.create(workload.pod_body(NS, "partner-0", "partner"))
        cluster.create(workload.group_body(NS, "third", {workload.GPU: 1}))
        cluster.create(workload.pod_body(NS, "third-0", "third"))
        await workload.until(lambda: len(workload.bound_pods(cluster, NS)) == 5, "the standby bound the rest")
        assert history.holders() == ["replica-a", "replica-b"] and lease(cluster)["leaseTransitions"] == 1
        # It took over no sooner than a lease duration after the last renewal it could have seen (both
        # stamps are this machine's clock), and placed nothing before it held the Lease.
        last_renewal = [spec for _, spec in history.leases if spec["holderIdentity"] == "replica-a"][-1]
        taken_rv, taken = history.taken_by("replica-b")
        waited = micro_time(taken["acquireTime"]) - micro_time(last_renewal["renewTime"])
        assert waited.total_seconds() >= LEASE_DURATION, f"took over an unexpired Lease ({waited})"
        assert all(history.bound_at[p] > taken_rv for p in ("second-1", "first-1", "partner-0"))
        # The node is full: the new leader decided third-0 and refused it.
        await workload.until(lambda: refused(cluster, "third-0"), "third-0 refused")
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
    cluster: Any, watchdog: Watchdog, history: History
) -> None:
    setup(cluster)
    replicas = list(await asyncio.gather(replica(cluster, "replica-0"), replica(cluster, "replica-1")))
    try:
        await workload.until(lambda: holder(cluster), "one replica holds the Lease")
        cluster.create(workload.group_body(NS, "g", {workload.GPU: 2}))
        cluster.create(workload.pod_body(NS, "g-0", "g"))
        await workload.until(lambda: workload.bound_pods(cluster, NS), "the leader schedules")
        leader = next(r for r in replicas if r.config.identity == holder(cluster))
        other = next(r for r in replicas if r is not leader)
        # Several election rounds: three more renewals, and nobody flips meanwhile.
        renewals = len(history.leases)
        await workload.until(lambda: len(history.leases) >= renewals + 3, "three more renewals")
        scheduling = [r.config.identity for r in replicas if r.runtime is not None and r.runtime.scheduling]
        assert scheduling == [leader.config.identity]
        assert history.holders() == [leader.config.identity]
        # The leader stops gracefully: it releases the Lease (an empty holder), and the other takes the free
        # Lease (that it does so at once, not a lease duration later, is test_leadership's to time).
        await leader.stop()
        cluster.create(workload.pod_body(NS, "g-1", "g"))
        await workload.until(lambda: len(workload.bound_pods(cluster, NS)) == 2, "the other schedules")
        assert history.holders() == [leader.config.identity, "", other.config.identity]
        assert history.bound_at["g-1"] > history.taken_by(other.config.identity)[0]
    finally:
        for r in replicas:
            if r.alive:
                await kill(r)


async def test_a_partitioned_leader_stops_placing_and_nobody_places_until_a_lease_is_held(
    cluster: Any, watchdog: Watchdog, history: History
) -> None:
    setup(cluster)
    active, standby = await leader_and_standby(cluster)
    try:
        cluster.create(workload.group_body(NS, "g", {workload.GPU: 2}))
        cluster.create(workload.pod_body(NS, "g-0", "g"))
        await workload.until(lambda: workload.bound_pods(cluster, NS), "the leader schedules")
        # The API refuses every write to the Lease, as if the leader were cut off from it.
        cut = cluster.inject_fault("PUT", rf"/leases/{LEASE}$", status=503, times=None)
        await workload.until(lambda: not active.runtime.scheduling, "the leader stops")
        # Nobody may place now. The standby waits the Lease out, tries to take it and is refused; the old
        # leader tries to renew and is refused: neither schedules.
        cluster.create(workload.pod_body(NS, "g-1", "g"))
        tried = lease_attempts(cluster, "replica-b")
        await workload.until(lambda: lease_attempts(cluster, "replica-b") > tried, "the standby's try for the Lease")
        assert not standby.runtime.scheduling and not active.runtime.scheduling
        assert cut.fired >= 2  # both were refused: the cut fired
        # The partition heals: one replica leads again, rebuilds, and places the waiting pod.
        cluster.clear_faults()
        healed = len(history.leases)
        await workload.until(lambda: len(workload.bound_pods(cluster, NS)) == 2, "a leader places again")
        first_record_after_heal = history.leases[healed][0]
        assert history.bound_at["g-1"] > first_record_after_heal, "g-1 was placed while nobody held the Lease"
        invariants.assert_no_double_allocation(invariants.from_sandbox(cluster))
    finally:
        for r in (active, standby):
            await kill(r)


async def test_a_leader_whose_lease_is_taken_stops_placing_and_nobody_places_until_it_expires(
    cluster: Any, watchdog: Watchdog, history: History
) -> None:
    setup(cluster)
    active, standby = await leader_and_standby(cluster)
    try:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        cluster.patch("leases", LEASE, {"spec": {"holderIdentity": "intruder", "renewTime": now}},
                      names.DEFAULT_NAMESPACE)
        intruded = history.leases[-1][0]
        await workload.until(lambda: not active.runtime.scheduling, "the leader stops")
        cluster.create(workload.group_body(NS, "g", {workload.GPU: 2}))
        cluster.create(workload.pod_body(NS, "g-0", "g"))
        # The intruder never renews: once its Lease expires a replica takes over and places the pod,
        # and not before (by the order the API recorded them in).
        await workload.until(lambda: workload.bound_pods(cluster, NS), "a replica takes over")
        new_holder = holder(cluster)
        assert new_holder in {"replica-a", "replica-b"}
        assert history.holders()[-2:] == ["intruder", new_holder]
        taken_rv, _ = history.taken_by(new_holder)
        assert intruded < taken_rv < history.bound_at["g-0"], "a replica placed while another held the Lease"
    finally:
        for r in (active, standby):
            await kill(r)
