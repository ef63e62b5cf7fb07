"""A leader that is provably alone: renewals during a slow take-over, fenced writes, no event lost across terms.

- client-go renews the Lease from the moment it is acquired, concurrently with ``OnStartedLeading``. A leader
  that rebuilt first and renewed only afterwards lost its Lease whenever the rebuild outlasted the lease
  duration, and the standby then scheduled beside it.
- A deposed leader writes nothing: writes pass a fence (closed the moment the leader loses the Lease or its
  renew deadline passes), and a write already in flight carries a server-side deadline that ends with the
  leader's renew deadline: the server gives it up rather than apply it late.
- A new term's watches resume from its rebuild's lists: a pod created while the rebuild is in progress is
  placed (it used to land in the state the rebuild was about to replace, and stay Pending).
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import pytest

from deviceshare.api import names
from tests.operator.conftest import operator_config
from tests.reliability import workload
from tests.reliability.conftest import Replica, Watchdog, kill, launch

NS = "fence"
LEASE = "deviceshare-operator"
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 2.0, 1.5, 0.25
# The new-term rebuild tests count the replica's terms: the intruder's lease deposes it (seen at its next
# renewal, whatever the deadline), and a deadline long enough that a busy machine's stalled renewals do not
# depose it a second time (a third term, seen under a loaded full suite), at no cost in time.
ROOMY_LEASE = {"lease_duration": 8.0, "renew_deadline": 6.0}
GROUP_STATUS = rf"/namespaces/{NS}/{names.PLURAL}/[^/]+/status$"


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 1, "gpus": 4}


def holder(cluster: Any) -> str | None:
    return ((cluster.get("leases", LEASE, names.DEFAULT_NAMESPACE) or {}).get("spec") or {}).get("holderIdentity")


class Writes:
    """What one replica's API writes ended as, with the time each outcome was known (monotonic)."""

    def __init__(self, replica: Replica) -> None:
        self.seen: list[tuple[float, str, str, str]] = []
        api = replica.runtime.ctx.api
        counted = api.on_write

        def record(verb: str, resource: str, result: str) -> None:
            self.seen.append((time.monotonic(), verb, resource, result))
            counted(verb, resource, result)

        api.on_write = record

    def outside_leases(self, since: float = 0.0) -> list[tuple[float, str, str, str]]:
        return [w for w in self.seen if w[0] >= since and w[2] != "leases"]


async def replica(cluster: Any, identity: str, **config: Any) -> Replica:
    settings = {"lease_duration": LEASE_DURATION, "renew_deadline": RENEW_DEADLINE, "retry_period": RETRY_PERIOD}
    return await launch(operator_config(cluster, lease_name=LEASE, identity=identity, **{**settings, **config}))


def setup(cluster: Any) -> None:
    workload.ensure_namespace(cluster, NS)
    workload.ensure_namespace(cluster, names.DEFAULT_NAMESPACE)


def claimed(cluster: Any) -> bool:
    """A status write claiming devices for a group reached the API server (held or not)."""
    return any(str(r.method.value) == "PATCH" and r.url.path.endswith("/status")
               and "allocatedDevices" in (r.text or "") for r in cluster.api)


def take_the_lease(cluster: Any, duration: int) -> None:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    cluster.patch("leases", LEASE, {"spec": {"holderIdentity": "intruder", "renewTime": now,
                                             "leaseDurationSeconds": duration}}, names.DEFAULT_NAMESPACE)


async def test_a_take_over_longer_than_the_lease_keeps_the_lease_and_no_second_replica_schedules(
    cluster: Any, watchdog: Watchdog
) -> None:
    setup(cluster)
    slow = 2 * LEASE_DURATION
    rebuild = cluster.inject_fault("GET", r"^/api/v1/pods$", delay=slow)  # the rebuild's list of pods
    first = await replica(cluster, "replica-a")
    try:
        await workload.until(lambda: rebuild.fired, "the first replica's rebuild under way")
        acquired = time.monotonic()
        second = await replica(cluster, "replica-b")
        standby = Writes(second)
        cluster.create(workload.group_body(NS, "g", {workload.GPU: 2}))
        cluster.create(workload.pod_body(NS, "g-0", "g"))
        await workload.until(lambda: first.runtime.scheduling, "the first replica schedules after its rebuild")
        took = time.monotonic() - acquired
        assert took >= LEASE_DURATION, f"the take-over lasted {took:.1f}s, not longer than the lease: tests nothing"
        await workload.until(lambda: workload.bound_pods(cluster, NS), "the leader binds the pod")

        assert holder(cluster) == "replica-a"
        lease = cluster.get("leases", LEASE, names.DEFAULT_NAMESPACE)["spec"]
        assert lease.get("leaseTransitions", 0) == 0, "the Lease changed hands during the take-over"
        assert second.runtime.leadership.terms == 0 and not second.runtime.scheduling
        assert standby.outside_leases() == [], "the standby wrote"
    finally:
        cluster.clear_faults()
        await kill(first)
        await kill(second)


async def test_a_deposed_leaders_write_in_flight_is_given_up_and_it_writes_nothing_after(
    cluster: Any, watchdog: Watchdog
) -> None:
    setup(cluster)
    leader = await replica(cluster, "replica-a")
    try:
        await workload.until(lambda: leader.runtime is not None and leader.runtime.scheduling, "the leader schedules")
        writes = Writes(leader)
        # Every status write of the group is held by the server, never released: the claim's among them,
        # whether or not the reconciler's first status (a moment after the group, on a slow machine) came first.
        held = cluster.inject_fault("PATCH", GROUP_STATUS, hold=True, times=None)
        cluster.create(workload.group_body(NS, "g", {workload.GPU: 2}))
        cluster.create(workload.pod_body(NS, "g-0", "g"))
        await workload.until(lambda: held.fired and claimed(cluster), "the claim's status write in flight")
        take_the_lease(cluster, duration=60)
        await workload.until(lambda: not leader.runtime.leadership.active.is_set(), "the leader is deposed")
        deposed = time.monotonic()
        # The server gives each held write up at the deadline it carried (at most the renew deadline): never
        # applied.
        await workload.until(lambda: len(held.answered) == held.fired, "the held writes given up")
        assert set(held.answered) == {504} and held.given_up == held.fired

        group = cluster.get(names.PLURAL, "g", NS)
        assert (group.get("status") or {}).get("phase") != "Bound", "the deposed leader's claim landed"
        assert workload.bound_pods(cluster, NS) == []
        assert leader.runtime.ctx.api.fence.remaining() is None  # and nothing can be sent now
        sent = [w for w in writes.outside_leases(deposed) if w[3] != "fenced"]
        assert sent == [], f"the deposed leader wrote: {sent}"
    finally:
        cluster.clear_faults()
        await kill(leader)


async def test_a_pod_created_during_a_new_terms_rebuild_is_placed(cluster: Any, watchdog: Watchdog) -> None:
    setup(cluster)
    leader = await replica(cluster, "replica-a", election_settle=0.05, **ROOMY_LEASE)
    try:
        await workload.until(lambda: leader.runtime is not None and leader.runtime.scheduling, "the first term")
        cluster.create(workload.group_body(NS, "early", {workload.GPU: 1}))
        cluster.create(workload.pod_body(NS, "early-0", "early"))
        await workload.until(lambda: workload.bound_pods(cluster, NS), "the first term schedules")

        take_the_lease(cluster, duration=1)
        await workload.until(lambda: not leader.runtime.scheduling, "the leader deposed")
        # The next term's rebuild: its list of nodes is held while pods and groups are already listed.
        nodes = cluster.inject_fault("GET", r"^/api/v1/nodes$", hold=True)
        await workload.until(lambda: nodes.fired, "the second term's rebuild under way")
        assert not leader.runtime.scheduling
        cluster.create(workload.group_body(NS, "late", {workload.GPU: 1}))
        cluster.create(workload.pod_body(NS, "late-0", "late"))
        created = int(cluster.get("pods", "late-0", NS)["metadata"]["resourceVersion"])
        still_rebuilding = not leader.runtime.scheduling
        nodes.release()  # the rebuild goes on only now: the pod was surely created inside it

        await workload.until(lambda: len(workload.bound_pods(cluster, NS)) == 2, "the pod created mid-rebuild bound")
        listed = leader.runtime._listed["pods"]
        assert still_rebuilding and created > int(listed), "the pod was not created inside the rebuild's window"
        assert leader.runtime.leadership.terms == 2
    finally:
        cluster.clear_faults()
        await kill(leader)


@pytest.mark.parametrize("through_kopf", [False, True], ids=["reflector", "kopf"])
async def test_groups_created_changed_and_deleted_during_a_new_terms_rebuild_are_all_handled(
    cluster: Any, watchdog: Watchdog, through_kopf: bool
) -> None:
    """Nothing a group does during a rebuild is lost, and nothing is applied to the state being replaced: our own
    group watch resumes from the rebuild's list; Kopf's stream (``--groups-through-kopf``), which runs across terms,
    is held during the rebuild, then replayed onto the rebuilt state. The groups without pods are the ones only
    their own events can bring to the operator (no pod event asks for them)."""
    setup(cluster)
    leader = await replica(
        cluster, "replica-a", election_settle=0.05, groups_through_kopf=through_kopf, **ROOMY_LEASE
    )
    try:
        await workload.until(lambda: leader.runtime is not None and leader.runtime.scheduling, "the first term")
        cluster.create(workload.group_body(NS, "idle", {workload.GPU: 1}))
        cluster.create(workload.group_body(NS, "resized", {workload.GPU: 8}))  # more than the node has
        cluster.create(workload.pod_body(NS, "resized-0", "resized"))
        await workload.until(lambda: has_finalizer(cluster, "idle"), "our finalizer on the idle group")
        await workload.until(lambda: workload.failed_scheduling(cluster, NS, "resized-0"), "resized-0 unschedulable")

        take_the_lease(cluster, duration=1)
        await workload.until(lambda: not leader.runtime.scheduling, "the leader deposed")
        # The next term's rebuild: its list of nodes is held while pods and groups are already listed.
        nodes = cluster.inject_fault("GET", r"^/api/v1/nodes$", hold=True)
        await workload.until(lambda: nodes.fired, "the second term's rebuild under way")
        cluster.create(workload.group_body(NS, "fresh", {workload.GPU: 1}))
        cluster.patch(names.PLURAL, "resized", {"spec": {"resources": {workload.GPU: 1}}}, NS)
        cluster.delete(names.PLURAL, "idle", NS)  # held by our finalizer: the operator must let it go
        changed = [int(cluster.get(names.PLURAL, g, NS)["metadata"]["resourceVersion"]) for g in ("fresh", "resized")]
        if through_kopf:  # Kopf's stream brings the three changes (on its own thread's loop) while the rebuild waits.
            await workload.until(lambda: leader.runtime.intake.groups.holding >= 3, "the three group events held")
        held = (leader.runtime.intake.groups.state == "held" or not through_kopf) and not leader.runtime.scheduling
        nodes.release()  # the rebuild goes on only now: the groups surely changed inside it
        await workload.until(lambda: leader.runtime.scheduling, "the second term schedules")
        listed, term = int(leader.runtime._listed["groups"]), leader.runtime.leadership.terms

        await workload.until(lambda: cluster.get(names.PLURAL, "idle", NS) is None, "the idle group deleted, gone")
        await workload.until(lambda: has_finalizer(cluster, "fresh") and phase(cluster, "fresh") == "Pending",
                             "the new group's finalizer and status")
        await workload.until(lambda: workload.bound_pods(cluster, NS), "the resized group's pod bound")
        assert held, "the groups did not change inside the rebuild's window"
        assert term == 2 and min(changed) > listed, "the changes were in the rebuild's list"
    finally:
        cluster.clear_faults()
        await kill(leader)


def has_finalizer(cluster: Any, group: str) -> bool:
    return names.GROUP_FINALIZER in cluster.get(names.PLURAL, group, NS)["metadata"].get("finalizers", [])


def phase(cluster: Any, group: str) -> str | None:
    return (cluster.get(names.PLURAL, group, NS).get("status") or {}).get("phase")
