"""Churn of groups on Dynamic Resource Allocation (CONTRACT §13) beside device-plugin groups, with the API's faults,
an operator restart and a leader failover, every claim change judged as the API stores it
(``drainvariants.ClaimWitness``).

Two of the four nodes are the DRA pool (labelled as ``deviceshare demo`` labels its DRA node: only there does the
simulated NVIDIA driver publish slices, so there the GPUs are DRA devices and not ``nvidia.com/gpu``). Tenants
(``test_churn.actor``) create DRA groups (1 to 3 devices, binpack / spread / fgd) with members wired to the group's
claim, and device-plugin groups (whole and shared GPUs); they finish and delete members and delete groups at their
own seeded pace; kube-scheduler holds one DRA device in its own claim all along. Meanwhile the claim status patches
(allocation and reservedFor) land but lose their answer (504, dropped connection) or are refused (500, a connection
dropped before the write), bindings and claim object writes lose answers, and the operator is killed while a claim
status patch of its is on the wire, which lands after it died: then a new operator starts (a restart) or the
standby replica takes the Lease over (a failover).

Never: a device in two claims' allocations, a running member not reserved in its claim or not on the allocation's
node, a claim deleted while allocated, a kubelet that cannot prepare a member's claim; a device-plugin group on a DRA
node, or the device-plugin invariant broken. At the end every group's claim is deallocated and deleted, a last wave
takes every free device of both kinds (nothing leaked) and the groups that do not fit say why. The seed is printed
on failure (``DEVICESHARE_DRA_SEED`` replays one).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from deviceshare.api import names
from deviceshare.sandbox import faults
from tests.operator import dra
from tests.operator.conftest import operator_config
from tests.reliability import drainvariants, workload
from tests.reliability import test_churn_priority as priority
from tests.reliability import test_fencing as fencing
from tests.reliability.conftest import Replica, Watchdog, kill, launch
from tests.reliability.test_churn import NS, Tally, actor
from tests.reliability.test_failover import holder, replica

CLAIM_STATUS = rf"/namespaces/{NS}/resourceclaims/[^/]+/status$"
POOL_LABEL = "deviceshare.io/pool"  # the label ``deviceshare demo`` gives its DRA node
DRA_NODES = frozenset({"gpu-node-2", "gpu-node-3"})
FOREIGN = ("gpu-node-2", "gpu-0")  # kube-scheduler's, the whole run
DRA_TENANTS, PLUGIN_TENANTS = 6, 3
PRIO_NS = "dra-prio"


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 4, "gpus": 4, "dra": True, "dra_nodes": {POOL_LABEL: "dra"}}


def seeds() -> list[int]:
    return [int(os.environ["DEVICESHARE_DRA_SEED"])] if "DEVICESHARE_DRA_SEED" in os.environ else [11]


def bound(cluster: Any, pod: str) -> bool:
    return bool(((cluster.get("pods", pod, NS) or {}).get("spec") or {}).get("nodeName"))


def lie_to(cluster: Any, rng: random.Random, ns: str = NS) -> dict[str, faults.Fault]:
    """Every n-th write of each kind (n drawn from the seed) loses its answer after landing, or is refused."""
    def every(low: int, high: int) -> int:
        return rng.randint(low, high)

    claim, status = rf"/namespaces/{ns}/resourceclaims/[^/]+$", rf"/namespaces/{ns}/resourceclaims/[^/]+/status$"
    return {
        "claim status: 504 after landing": cluster.inject_fault(
            "PATCH", status, status=504, applied=True, times=None, every=every(3, 5)),
        "claim status: dropped after landing": cluster.inject_fault(
            "PATCH", status, drop=True, applied=True, times=None, every=every(4, 6)),
        "claim status: 500, not applied": cluster.inject_fault(
            "PATCH", status, status=500, times=None, every=every(5, 7)),
        "claim status: dropped before landing": cluster.inject_fault(
            "PATCH", status, drop=True, times=None, every=every(6, 8)),
        "binding: 504 after landing": cluster.inject_fault(
            "POST", rf"/namespaces/{ns}/pods/[^/]+/binding$", status=504, applied=True, times=None, every=every(4, 6)),
        "claim create: dropped after landing": cluster.inject_fault(
            "POST", rf"/namespaces/{ns}/resourceclaims$", drop=True, applied=True, times=None, every=every(3, 5)),
        "claim finalizers: 504 after landing": cluster.inject_fault(
            "PATCH", claim, status=504, applied=True, times=None, every=every(2, 4)),
        "claim delete: 503": cluster.inject_fault("DELETE", claim, status=503, times=None, every=every(2, 4)),
    }


def waiting_without_reason(cluster: Any) -> list[str]:
    """Pending pods (unbound, not being deleted) the scheduler has not told why they wait."""
    out = []
    for pod in cluster.list("pods", NS):
        if pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
            continue
        said = [c for c in (pod.get("status") or {}).get("conditions") or []
                if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("message")]
        if not said:
            out.append(pod["metadata"]["name"])
    return out


async def last_wave(cluster: Any) -> None:
    """After the churn, free or something leaked: 3 DRA devices of gpu-node-2 (kube-scheduler holds its fourth) and
    gpu-node-3's 4, and the 4 GPUs of each device-plugin node. Two groups of each kind take them all; a third of
    each kind waits and says why."""
    def dra_group(name: str, count: int) -> dict[str, Any]:
        body = workload.dra_group_body(random.Random(0), NS, name)
        body["spec"].update(claim={"deviceClassName": workload.DRA_CLASS, "count": count},
                            schedulingStrategy="binpack")
        return body

    cluster.create(dra_group("last-3", 3))  # first, so that binpack gives it the node with 3 free
    cluster.create(workload.dra_pod_body(NS, "last-3-0", "last-3"))
    await workload.until(lambda: bound(cluster, "last-3-0"), "the 3-device DRA group bound")
    for name in ("last-4a", "last-4b"):
        cluster.create(dra_group(name, 4))
        cluster.create(workload.dra_pod_body(NS, f"{name}-0", name))
    for name in ("last-gpu-a", "last-gpu-b", "last-gpu-c"):
        cluster.create(workload.group_body(NS, name, {workload.GPU: 4}))
        cluster.create(workload.pod_body(NS, f"{name}-0", name))
    await workload.until(lambda: len(workload.bound_pods(cluster, NS)) == 4 and not waiting_without_reason(cluster),
                         "four of the last wave bound, the other two told why they wait")
    assert drainvariants.mirrors(cluster, NS, workload.DRA_CLASS) == []
    assert sorted(p["spec"]["nodeName"] for p in workload.bound_pods(cluster, NS)) == [
        "gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3"]


Disruption = Callable[[Any, Tally, list[Replica]], Awaitable[None]]


async def kill_mid_write(cluster: Any, tally: Tally, replicas: list[Replica], leader: Replica) -> None:
    """The leader killed while its claim status patch is held on the wire; the patch lands after it died."""
    await workload.until(lambda: tally.bound_at_delete >= 6, "churn before the kill")
    held = cluster.inject_fault("PATCH", CLAIM_STATUS, hold=True)
    await workload.until(lambda: held.fired, "a claim status patch in flight")
    await kill(leader)
    held.release()
    await workload.until(lambda: held.answered, "the dead operator's claim patch landed")


async def restart(cluster: Any, tally: Tally, replicas: list[Replica]) -> None:
    await kill_mid_write(cluster, tally, replicas, replicas[0])
    replicas.append(await launch(operator_config(cluster)))


async def failover(cluster: Any, tally: Tally, replicas: list[Replica]) -> None:
    leader = next(r for r in replicas if r.config.identity == holder(cluster))
    await kill_mid_write(cluster, tally, replicas, leader)
    other = next(r for r in replicas if r is not leader)
    await workload.until(lambda: holder(cluster) == other.config.identity, "the standby takes the Lease over")


async def churn(cluster: Any, kube: Any, seed: int, replicas: list[Replica], disrupt: Disruption) -> str:
    """The churn with faults around ``disrupt``; returns a one-line account. Fails on any violation."""
    rng = random.Random(seed)
    witness = drainvariants.ClaimWitness()
    cluster.store.listeners.append(witness)
    watchdog = Watchdog(cluster, judge=lambda c: drainvariants.device_plugin_breaches(c, DRA_NODES))
    watchdog.start()
    workload.ensure_namespace(cluster, NS)
    await dra.allocate_foreign(kube, "other", "theirs", FOREIGN[0], [FOREIGN[1]])
    lies = lie_to(cluster, rng)
    tally, stop = Tally(), asyncio.Event()
    loop = asyncio.get_running_loop()
    start = loop.time()
    tenants = [loop.create_task(actor(cluster, i, lambda: not stop.is_set(), seed, tally, group_body=(
        workload.dra_group_body if i < DRA_TENANTS else workload.mixed_group_body), member_body=(
        workload.dra_pod_body if i < DRA_TENANTS else workload.pod_body))) for i in range(DRA_TENANTS + PLUGIN_TENANTS)]
    account = ""
    try:
        await disrupt(cluster, tally, replicas)
        after = witness.reservations
        await workload.until(lambda: (witness.reservations >= after + 10 and all(f.fired for f in lies.values()))
                             or any(t.done() for t in tenants), "churn after the disruption, every lie told")
        stop.set()
        for t in tenants:
            await t
        cluster.clear_faults()
        told = {kind: f.fired for kind, f in lies.items()}
        assert all(told.values()), f"seed {seed}: a lie never fired: {told}"
        await workload.until(lambda: not cluster.list(names.PLURAL, NS) and not cluster.list("resourceclaims", NS),
                             "every group released and gone with its claim")
        await last_wave(cluster)
        account = (f"seed {seed}: {loop.time() - start:.1f}s, {tally.groups} groups, {tally.bound_at_delete} members "
                   f"bound when deleted, {tally.completed} finished; DRA: {witness.changes} changes judged, "
                   f"{witness.reservations} members seen running, {witness.deleted_claims} claims deleted; "
                   f"{watchdog.checks} device-plugin checks; lies {told}")
    finally:
        stop.set()
        for t in tenants:
            t.cancel()
        for r in replicas:
            await kill(r)
        await watchdog.stop()
        cluster.store.listeners.remove(witness)
        print(f"\n{account or f'seed {seed}: failed'}\n" + "\n".join(witness.found + watchdog.found))
    assert witness.reservations >= 15 and witness.deleted_claims >= 5, f"seed {seed}: churn too thin: {account}"
    found = witness.found + drainvariants.prepare_failures(cluster, NS) + watchdog.found
    assert not found, f"seed {seed} (DEVICESHARE_DRA_SEED={seed} replays it):\n" + "\n".join(found)
    return account


def label_the_dra_pool(cluster: Any) -> Any:
    for node in sorted(DRA_NODES):
        cluster.patch("nodes", node, {"metadata": {"labels": {POOL_LABEL: "dra"}}})
    return workload.until(lambda: {s["spec"].get("nodeName") for s in cluster.list("resourceslices")} == DRA_NODES,
                          "the driver's slices on the DRA pool's nodes")


@pytest.mark.parametrize("seed", seeds())
async def test_dra_churn_with_lost_claim_writes_and_a_restart(cluster: Any, kube: Any, seed: int) -> None:
    await label_the_dra_pool(cluster)
    replicas = [await launch(operator_config(cluster))]
    await churn(cluster, kube, seed, replicas, restart)


@pytest.mark.parametrize("seed", seeds())
async def test_dra_churn_with_lost_claim_writes_and_a_leader_failover(cluster: Any, kube: Any, seed: int) -> None:
    await label_the_dra_pool(cluster)
    workload.ensure_namespace(cluster, names.DEFAULT_NAMESPACE)
    replicas = [await replica(cluster, "replica-a")]
    await workload.until(lambda: holder(cluster) == "replica-a", "the first replica leads")
    replicas.append(await replica(cluster, "replica-b"))
    await churn(cluster, kube, seed + 1, replicas, failover)


@pytest.mark.parametrize("seed", seeds())
async def test_dra_churn_with_priorities_gangs_and_budgets(cluster: Any, seed: int) -> None:
    """test_churn_priority's tenants on the DRA pool: preemption by eviction releases a claim only once no victim
    runs, a gang's members are each reserved before they bind, and no device is in two claims meanwhile."""
    await label_the_dra_pool(cluster)
    workload.ensure_namespace(cluster, PRIO_NS)
    for name, value in priority.CLASSES.items():
        cluster.create({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                        "value": value})
    witness = drainvariants.ClaimWitness()
    cluster.store.listeners.append(witness)
    rng, gangs, stop = random.Random(seed), dict[str, int](), asyncio.Event()
    lies = lie_to(cluster, rng, PRIO_NS)
    running = await launch(operator_config(cluster))
    loop = asyncio.get_running_loop()
    tenants = [loop.create_task(priority.tenant(cluster, i, lambda: not stop.is_set(), random.Random(rng.random()),
                                                gangs, dra=True, ns=PRIO_NS)) for i in range(6)]
    def progress() -> str:
        return (f"seed {seed}: {priority.preemptions(running):.0f} preemptions, "
                f"{len(priority.started_gangs(cluster, gangs, PRIO_NS))}/{len(gangs)} gangs started, "
                f"{witness.reservations} members seen running, {len(cluster.list(names.PLURAL, PRIO_NS))} groups and "
                f"{len(cluster.list('resourceclaims', PRIO_NS))} claims now, lies {[f.fired for f in lies.values()]}")

    try:
        try:
            await workload.until(lambda: (priority.preemptions(running) >= 3 and witness.reservations >= 20
                                          and len(priority.started_gangs(cluster, gangs, PRIO_NS)) >= 3
                                          and all(f.fired for k, f in lies.items() if k.startswith("claim status")))
                                 or any(t.done() for t in tenants), "3 preemptions and 3 gang starts of DRA groups")
        except AssertionError as e:
            raise AssertionError(f"{e}: {progress()}\n" + "\n".join(witness.found)) from None
        stop.set()
        await asyncio.gather(*tenants)
        cluster.clear_faults()
        told = {kind: f.fired for kind, f in lies.items()}
        assert all(f for kind, f in told.items() if kind.startswith("claim status")), f"seed {seed}: {told}"
        preempted, started = priority.preemptions(running), priority.started_gangs(cluster, gangs, PRIO_NS)
        await workload.until(lambda: not cluster.list(names.PLURAL, PRIO_NS)
                             and not cluster.list("resourceclaims", PRIO_NS), "every group gone with its claim")
    finally:
        stop.set()
        for t in tenants:
            t.cancel()
        await kill(running)
        cluster.store.listeners.remove(witness)
    print(f"\nseed {seed}: {preempted:.0f} preemptions, {len(started)}/{len(gangs)} gangs started, "
          f"{witness.changes} changes judged, {witness.reservations} members seen running; lies {told}")
    assert preempted > 0 and started, f"seed {seed}: no preemption or no gang start: the churn tested nothing of it"
    found = witness.found + drainvariants.prepare_failures(cluster, PRIO_NS)
    assert not found, f"seed {seed} (DEVICESHARE_DRA_SEED={seed} replays it):\n" + "\n".join(found)


async def test_a_deposed_leaders_claim_write_in_flight_is_given_up(cluster: Any) -> None:
    """The claim's allocation and reservation, held on the wire while the leader is deposed, never land: the write
    carried the leader's time left as its server-side deadline (test_fencing's rule, for the claim's status too), so
    a successor that does not know of it can never find its devices allocated behind its back."""
    await label_the_dra_pool(cluster)
    fencing.setup(cluster)
    leader = await fencing.replica(cluster, "replica-a")
    try:
        await workload.until(lambda: leader.runtime is not None and leader.runtime.scheduling, "the leader schedules")
        writes = fencing.Writes(leader)
        held = cluster.inject_fault("PATCH", rf"/namespaces/{fencing.NS}/resourceclaims/[^/]+/status$", hold=True,
                                    times=None)
        cluster.create(workload.on_dra(workload.group_body(fencing.NS, "g", {workload.GPU: 2})))
        cluster.create(workload.dra_pod_body(fencing.NS, "g-0", "g"))
        await workload.until(lambda: held.fired, "the claim's allocation in flight")
        fencing.take_the_lease(cluster, duration=60)
        await workload.until(lambda: not leader.runtime.leadership.active.is_set(), "the leader is deposed")
        deposed = time.monotonic()
        await workload.until(lambda: len(held.answered) == held.fired, "the held claim writes given up")
        assert set(held.answered) == {504} and held.given_up == held.fired
        assert drainvariants.claim_view(cluster.get("resourceclaims", "g-devices", fencing.NS) or {}).devices == set()
        assert workload.bound_pods(cluster, fencing.NS) == []
        sent = [w for w in writes.outside_leases(deposed) if w[3] != "fenced"]
        assert sent == [], f"the deposed leader wrote: {sent}"
    finally:
        cluster.clear_faults()
        await kill(leader)
