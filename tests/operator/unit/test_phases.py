"""The scheduling cycle's gang permit and preemption post-filter against an in-memory API: what each writes.

The end-to-end scenarios are tests/operator/test_gang.py and tests/reliability/test_preemption.py; here a failure
names the scheduler (or the reconciler's release of a victim), and every write is counted.
"""

from __future__ import annotations

from deviceshare.api import names
from deviceshare.operator.scheduler import Result
from tests.operator.unit.fakeapi import GPU, Harness, node

G = ("ns", "g")


async def test_a_gang_short_of_members_writes_nothing_and_holds_nothing() -> None:
    h = Harness(node("n1", 2))
    h.see(h.api.add_group("g", minMembers=3))
    for pod in ("a", "b"):
        h.see(h.api.add_pod(pod, "g"))

    outcome = await h.scheduler.schedule(("ns", "b"))

    assert (outcome.result, outcome.message) == (Result.UNSCHEDULABLE, "2/3 member pods exist")
    assert h.api.writes == [] and h.ctx.ledger.allocation(G) is None
    assert h.ctx.unschedulable[G] == "2/3 member pods exist"


async def test_a_gang_starts_with_its_last_member_and_binds_them_all_in_that_cycle() -> None:
    h = Harness(node("n1", 2))
    h.see(h.api.add_group("g", minMembers=3))
    for pod in ("a", "b", "c"):
        h.see(h.api.add_pod(pod, "g"))

    outcome = await h.scheduler.schedule(("ns", "c"))

    assert outcome.result is Result.BOUND and sorted(outcome.also_bound) == [("ns", "a"), ("ns", "b")]
    # One finalizer and one status write for the group, then a Binding per member, the placing pod first.
    assert [(w.verb, w.key[1]) for w in h.api.writes] == [
        ("finalizers", "g"), ("status", "g"), ("bind", "c"), ("bind", "a"), ("bind", "b"),
    ]
    assert h.api.groups[G]["status"]["members"] == ["a", "b", "c"]
    assert {h.api.pods[("ns", p)]["spec"]["nodeName"] for p in "abc"} == {"n1"}
    assert G not in h.ctx.unschedulable


async def test_a_gang_whose_pods_do_not_fit_one_node_together_holds_nothing() -> None:
    h = Harness(node("n1", 2))  # 8 cores
    h.see(h.api.add_group("g", minMembers=2))
    for pod in ("a", "b"):
        h.see(h.api.add_pod(pod, "g", resources={"requests": {"cpu": "5"}}))

    outcome = await h.scheduler.schedule(("ns", "b"))

    assert outcome.result is Result.UNSCHEDULABLE
    assert outcome.message == "gang of 2 member pods: 0/1 nodes are available: 1 insufficient cpu."
    assert [w.verb for w in h.api.writes] == ["finalizers"] and h.ctx.ledger.allocation(G) is None


async def bound_low(h: Harness, name: str, gpus: int, priority: int) -> None:
    h.see(h.api.add_group(name, resources={GPU: gpus}))
    h.see(h.api.add_pod(f"{name}-0", name, priority=priority))
    assert (await h.scheduler.schedule(("ns", f"{name}-0"))).result is Result.BOUND
    h.see(h.api.pod_now(("ns", f"{name}-0"), phase="Running"))


async def test_a_higher_priority_group_evicts_the_victim_is_released_and_the_preemptor_takes_its_devices() -> None:
    h = Harness(node("n1", 2))
    await bound_low(h, "low", 2, priority=10)
    held = h.ctx.ledger.allocation(("ns", "low"))
    h.api.writes.clear()
    h.see(h.api.add_group("urgent", resources={GPU: 2}))
    h.see(h.api.add_pod("urgent-0", "urgent", priority=1000))

    outcome = await h.scheduler.schedule(("ns", "urgent-0"))

    assert outcome.result is Result.UNSCHEDULABLE
    assert "preempting ns/low (lower priority) on node n1" in outcome.message
    assert [(w.verb, w.key[1]) for w in h.api.writes] == [
        ("finalizers", "urgent"), ("status", "urgent"), ("evict", "low-0"),
    ]
    assert h.api.groups[("ns", "urgent")]["status"]["nominatedNodeName"] == "n1"
    assert h.ctx.preempted[("ns", "low")].by == ("ns", "urgent")
    # A new member of the victim waits; nothing joins the node being emptied.
    h.see(h.api.add_pod("low-1", "low", priority=10))
    assert (await h.scheduler.schedule(("ns", "low-1"))).result is Result.RETRY

    # The victim's pod is gone: the reconciler releases it (status first, then the ledger).
    del h.api.pods[("ns", "low-0")]
    h.ctx.state.remove_pod(("ns", "low-0"))
    assert await h.reconciler.reconcile(("ns", "low")) is True
    low = h.api.groups[("ns", "low")]["status"]
    assert low["phase"] == "Pending" and "allocatedDevices" not in low
    assert h.ctx.ledger.allocation(("ns", "low")) is None

    bound = await h.scheduler.schedule(("ns", "urgent-0"))
    assert bound.result is Result.BOUND
    assert h.ctx.ledger.allocation(("ns", "urgent")).devices == held.devices  # type: ignore[union-attr]
    assert "nominatedNodeName" not in h.api.groups[("ns", "urgent")]["status"]  # cleared with the placement
    assert len(h.ctx.nominations) == 0


async def test_equal_priority_is_never_preempted_and_says_nothing_more() -> None:
    h = Harness(node("n1", 2))
    await bound_low(h, "first", 2, priority=10)
    h.api.writes.clear()
    h.see(h.api.add_group("second", resources={GPU: 2}))
    h.see(h.api.add_pod("second-0", "second", priority=10))

    outcome = await h.scheduler.schedule(("ns", "second-0"))

    assert outcome.message == "0/1 nodes are available: 1 insufficient nvidia.com/gpu."
    assert [w.verb for w in h.api.writes] == ["finalizers"]


async def test_a_budget_that_refuses_protects_the_victim_and_the_nomination_is_dropped() -> None:
    h = Harness(node("n1", 2))
    await bound_low(h, "low", 2, priority=10)
    h.api.protected.add(("ns", "low-0"))
    h.see(h.api.add_group("urgent", resources={GPU: 2}))
    h.see(h.api.add_pod("urgent-0", "urgent", priority=1000))

    outcome = await h.scheduler.schedule(("ns", "urgent-0"))

    assert outcome.result is Result.UNSCHEDULABLE
    assert len(h.ctx.nominations) == 0 and ("ns", "low") not in h.ctx.preempted
    again = await h.scheduler.schedule(("ns", "urgent-0"))  # the protected group is not chosen again
    assert "No preemption victims found" in again.message or "insufficient" in again.message
    assert not any(w.verb == "evict" and w.key == ("ns", "low-0") for w in h.api.writes)
    assert h.api.groups[("ns", "low")]["status"]["phase"] == names.PHASE_BOUND
