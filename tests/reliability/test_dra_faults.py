"""Churn of groups on Dynamic Resource Allocation (CONTRACT §13) with the API's faults, an operator restart and a
leader failover, every claim change judged as the API stores it (``drainvariants.ClaimWitness``).

Tenants create DRA groups (1 to 3 devices, binpack / spread / fgd) and members wired to the group's claim, finish
and delete members and delete groups, at their own seeded pace; kube-scheduler holds one device in its own claim
all along. Meanwhile the claim status patches (allocation and reservedFor) land but lose their answer (504, dropped
connection) or are refused (500, a connection dropped before the write), bindings and claim object writes lose
answers, and the operator is killed while a claim status patch of its is on the wire, which lands after it died:
then either a new operator starts (a restart) or the standby replica takes the Lease over (a failover).

Never: a device in two claims' allocations, a running member not reserved in its claim or not on the
allocation's node, a claim deleted while allocated, a kubelet that cannot prepare a member's claim. At the end every
group's claim is deallocated and deleted, a last wave takes every free device (nothing leaked) and the group that
does not fit says why. The seed is printed on failure (and ``DEVICESHARE_DRA_SEED`` replays one).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from deviceshare.api import names
from deviceshare.sandbox import errors, faults
from tests.operator import dra
from tests.operator.conftest import operator_config
from tests.reliability import drainvariants, workload
from tests.reliability.conftest import Replica, kill, launch
from tests.reliability.test_failover import holder, replica

NS = "dra-faults"
CLAIM_STATUS = rf"/namespaces/{NS}/resourceclaims/[^/]+/status$"
FOREIGN = ("gpu-node-0", "gpu-0")  # kube-scheduler's, the whole run


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 3, "gpus": 4, "dra": True}


def seeds() -> list[int]:
    return [int(os.environ["DEVICESHARE_DRA_SEED"])] if "DEVICESHARE_DRA_SEED" in os.environ else [11]


@dataclasses.dataclass
class Tally:
    groups: int = 0
    bound_at_delete: int = 0
    completed: int = 0


def group_body(rng: random.Random, name: str) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION, "kind": names.KIND, "metadata": {"name": name, "namespace": NS},
        "spec": {"claim": {"deviceClassName": dra.CLASS, "count": rng.choice((1, 1, 2, 3))},
                 "schedulingStrategy": rng.choice(("binpack", "spread", "fgd"))},
    }


def member_body(name: str, group: str) -> dict[str, Any]:
    """A member as the webhook leaves one: the group's claim in ``spec.resourceClaims`` and the container's."""
    body = workload.pod_body(NS, name, group)
    body["spec"]["resourceClaims"] = [{"name": names.POD_CLAIM_NAME, "resourceClaimName": names.claim_name(group)}]
    body["spec"]["containers"][0]["resources"]["claims"] = [{"name": names.POD_CLAIM_NAME}]
    return body


def bound(cluster: Any, pod: str) -> bool:
    return bool(((cluster.get("pods", pod, NS) or {}).get("spec") or {}).get("nodeName"))


def delete_pod(cluster: Any, pod: str, tally: Tally) -> None:
    with contextlib.suppress(errors.ApiError):
        tally.bound_at_delete += bound(cluster, pod)
        cluster.delete("pods", pod, NS)


async def tenant(cluster: Any, seed: int, index: int, going: Callable[[], bool], tally: Tally) -> None:
    """A group, members that come, finish and go, then the group goes (first or last); again and again."""
    rng = random.Random(seed * 1000 + index)
    round_ = 0
    while going():
        group = f"t{index}-r{round_}"
        round_ += 1
        cluster.create(group_body(rng, group))
        tally.groups += 1
        pods: list[str] = []
        for step in range(rng.randint(2, 5)):
            action = rng.random()
            if action < 0.55 or not pods:
                pods.append(f"{group}-{step}")
                cluster.create(member_body(pods[-1], group))
            elif action < 0.75:
                pod = pods.pop(rng.randrange(len(pods)))
                with contextlib.suppress(errors.ApiError):
                    if bound(cluster, pod):
                        cluster.complete_pod(NS, pod)
                        tally.completed += 1
                delete_pod(cluster, pod, tally)
            else:
                delete_pod(cluster, pods.pop(rng.randrange(len(pods))), tally)
            await asyncio.sleep(rng.uniform(0.1, 0.5))  # the tenant's own pace: the workload, not a wait
        if rng.random() < 0.5:
            cluster.delete(names.PLURAL, group, NS)  # the group goes first and waits for its members
        for pod in pods:
            delete_pod(cluster, pod, tally)
        with contextlib.suppress(errors.ApiError):
            cluster.delete(names.PLURAL, group, NS)


def lie_to(cluster: Any, rng: random.Random) -> dict[str, faults.Fault]:
    """Every n-th write of each kind (n drawn from the seed) loses its answer after landing, or is refused."""
    def every(low: int, high: int) -> int:
        return rng.randint(low, high)

    claim = rf"/namespaces/{NS}/resourceclaims/[^/]+$"
    return {
        "claim status: 504 after landing": cluster.inject_fault(
            "PATCH", CLAIM_STATUS, status=504, applied=True, times=None, every=every(3, 5)),
        "claim status: dropped after landing": cluster.inject_fault(
            "PATCH", CLAIM_STATUS, drop=True, applied=True, times=None, every=every(4, 6)),
        "claim status: 500, not applied": cluster.inject_fault(
            "PATCH", CLAIM_STATUS, status=500, times=None, every=every(5, 7)),
        "claim status: dropped before landing": cluster.inject_fault(
            "PATCH", CLAIM_STATUS, drop=True, times=None, every=every(6, 8)),
        "binding: 504 after landing": cluster.inject_fault(
            "POST", rf"/namespaces/{NS}/pods/[^/]+/binding$", status=504, applied=True, times=None, every=every(4, 6)),
        "claim create: dropped after landing": cluster.inject_fault(
            "POST", rf"/namespaces/{NS}/resourceclaims$", drop=True, applied=True, times=None, every=every(3, 5)),
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
    """After the churn: 3 devices of gpu-node-0 (kube-scheduler holds its fourth) and the other nodes' 4 each are
    free, or something leaked. Three groups take all 11; a fourth waits and says why."""
    wave = {"last-3": 3, "last-4a": 4, "last-4b": 4, "last-4c": 4}
    for name, count in wave.items():
        cluster.create({"apiVersion": names.API_VERSION, "kind": names.KIND,
                        "metadata": {"name": name, "namespace": NS},
                        "spec": {"claim": {"deviceClassName": dra.CLASS, "count": count},
                                 "schedulingStrategy": "binpack"}})
        cluster.create(member_body(f"{name}-0", name))
        if name == "last-3":  # first, so that binpack gives it the node with 3 free
            await workload.until(lambda: bound(cluster, "last-3-0"), "the 3-device group bound")
    await workload.until(lambda: len(workload.bound_pods(cluster, NS)) == 3 and not waiting_without_reason(cluster),
                         "three of the last wave bound, the fourth told why it waits")
    assert drainvariants.mirrors(cluster, NS, dra.CLASS) == []


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
    workload.ensure_namespace(cluster, NS)
    await dra.allocate_foreign(kube, "other", "theirs", FOREIGN[0], [FOREIGN[1]])
    lies = lie_to(cluster, rng)
    tally, stop = Tally(), asyncio.Event()
    loop = asyncio.get_running_loop()
    start = loop.time()
    tenants = [loop.create_task(tenant(cluster, seed, i, lambda: not stop.is_set(), tally)) for i in range(5)]
    account = ""
    try:
        await disrupt(cluster, tally, replicas)
        after = tally.bound_at_delete
        await workload.until(lambda: (tally.bound_at_delete >= after + 10 and all(f.fired for f in lies.values()))
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
                   f"bound when deleted, {tally.completed} finished, {witness.changes} changes judged, "
                   f"{witness.reservations} members seen running, {witness.deleted_claims} claims deleted; lies {told}")
    finally:
        stop.set()
        for t in tenants:
            t.cancel()
        for r in replicas:
            await kill(r)
        cluster.store.listeners.remove(witness)
        print(f"\n{account or f'seed {seed}: failed'}\n" + "\n".join(witness.found))
    assert witness.reservations >= 20 and witness.deleted_claims >= 10, f"seed {seed}: churn too thin: {account}"
    found = witness.found + drainvariants.prepare_failures(cluster, NS)
    assert not found, f"seed {seed} (DEVICESHARE_DRA_SEED={seed} replays it):\n" + "\n".join(found)
    return account


@pytest.mark.parametrize("seed", seeds())
async def test_dra_churn_with_lost_claim_writes_and_a_restart(cluster: Any, kube: Any, seed: int) -> None:
    replicas = [await launch(operator_config(cluster))]
    await churn(cluster, kube, seed, replicas, restart)


@pytest.mark.parametrize("seed", seeds())
async def test_dra_churn_with_lost_claim_writes_and_a_leader_failover(cluster: Any, kube: Any, seed: int) -> None:
    workload.ensure_namespace(cluster, names.DEFAULT_NAMESPACE)
    replicas = [await replica(cluster, "replica-a")]
    await workload.until(lambda: holder(cluster) == "replica-a", "the first replica leads")
    replicas.append(await replica(cluster, "replica-b"))
    await churn(cluster, kube, seed + 1, replicas, failover)
