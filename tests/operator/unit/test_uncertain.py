"""PodScheduler and GroupReconciler when a write's outcome stays unknown (storage.Uncertain reaches them).

``storage`` resolves most lost answers by reading the object back (tests in test_storage_errors.py); what is left
for the scheduler is the case where even the read-back failed. Then nothing may be guessed: devices a write could
have claimed stay held until a later read tells (``settling.py``), a Binding that may have landed keeps its pod
counted as our member, and a deposed (cancelled) scheduler undoes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from deviceshare.api import names
from deviceshare.core import ledger as ledgers
from deviceshare.operator import storage
from deviceshare.operator.scheduler import Result
from tests.operator.unit.fakeapi import GPU, Harness, node

G, P = ("ns", "g"), ("ns", "p")


def placed(h: Harness) -> None:
    h.see(h.api.add_group("g", resources={GPU: 2}))
    h.see(h.api.add_pod("p", "g"))


async def test_a_claim_whose_answer_was_lost_keeps_its_devices_until_a_read_back_says_it_landed() -> None:
    h = Harness(node("n1", 2))
    placed(h)
    h.see(h.api.add_group("rival", resources={GPU: 2}))
    h.see(h.api.add_pod("r", "rival"))
    h.api.lose_answer["status"] = True  # the claim lands, its answer (and the read-back) is lost

    first = await h.scheduler.schedule(P)

    assert first.result is Result.RETRY
    assert G in h.ctx.unsettled
    held = h.ctx.ledger.allocation(G)
    assert held is not None and held.state is ledgers.AllocationState.RESERVED
    # The API shows g's claim: nobody else may have the devices meanwhile.
    rival = await h.scheduler.schedule(("ns", "r"))
    assert rival.result is Result.UNSCHEDULABLE
    # The next cycle reads the group back, finds the claim and binds: no second status write.
    assert (await h.scheduler.schedule(P)).result is Result.BOUND
    assert G not in h.ctx.unsettled
    assert [w.verb for w in h.api.writes if w.key in (G, P)] == ["finalizers", "status", "bind"]


async def test_a_claim_that_did_not_land_is_sent_again_on_the_version_it_was_conditional_on() -> None:
    h = Harness(node("n1", 2))
    placed(h)
    h.api.lose_answer["status"] = False  # lost before it landed

    assert (await h.scheduler.schedule(P)).result is Result.RETRY
    assert G in h.ctx.unsettled and h.api.groups[G]["status"] == {}

    assert (await h.scheduler.schedule(P)).result is Result.BOUND
    assert [w.verb for w in h.api.writes] == ["finalizers", "status", "bind"]
    assert h.api.groups[G]["status"]["phase"] == "Bound"


async def test_a_claim_that_can_no_longer_land_releases_its_devices() -> None:
    """The group moved on (someone wrote it) without our claim: a write conditional on the old version can never
    land, so only now may the devices go, and the group is placed anew from what it shows."""
    h = Harness(node("n1", 2))
    placed(h)
    h.api.lose_answer["status"] = False
    assert (await h.scheduler.schedule(P)).result is Result.RETRY
    h.api.groups[G]["metadata"]["resourceVersion"] = "999"  # e.g. a label added by its owner

    assert (await h.scheduler.schedule(P)).result is Result.BOUND
    assert G not in h.ctx.unsettled
    assert [w.verb for w in h.api.writes] == ["finalizers", "status", "bind"]


async def test_the_reconciler_settles_an_uncertain_claim_whose_pod_went_away() -> None:
    h = Harness(node("n1", 2))
    placed(h)
    h.api.lose_answer["status"] = True
    assert (await h.scheduler.schedule(P)).result is Result.RETRY
    del h.api.pods[P]
    h.ctx.state.remove_pod(P)

    await h.reconciler.reconcile(G)

    assert G not in h.ctx.unsettled
    allocation = h.ctx.ledger.allocation(G)
    assert allocation is not None and allocation.state is ledgers.AllocationState.COMMITTED  # it landed: held


async def test_a_binding_that_may_have_landed_keeps_the_group_placed_and_the_pod_a_member() -> None:
    h = Harness(node("n1", 2))
    placed(h)
    h.api.lose_answer["bind"] = True

    outcome = await h.scheduler.schedule(P)

    assert outcome.result is Result.RETRY
    assert h.ctx.ledger.allocation(G) is not None  # not rolled back
    assert h.api.groups[G]["status"]["phase"] == "Bound"
    # The watch shows the pod bound (the Binding had landed): it is our member, whatever its annotation says.
    body = h.api.pod_now(P, phase="Running")
    body["metadata"]["annotations"][names.POD_GROUP_ANNOTATION] = "elsewhere"
    h.see(body)
    assert [p.name for p in h.ctx.state.members_on_devices(G)] == ["p"]
    assert [w.verb for w in h.api.writes] == ["finalizers", "status", "bind"]  # no rollback write


async def test_a_binding_lost_before_it_landed_is_sent_again() -> None:
    h = Harness(node("n1", 2))
    placed(h)
    h.api.lose_answer["bind"] = False
    assert (await h.scheduler.schedule(P)).result is Result.RETRY
    assert (await h.scheduler.schedule(P)).result is Result.BOUND
    assert [w.verb for w in h.api.writes] == ["finalizers", "status", "bind"]


async def test_a_fenced_scheduler_writes_nothing_and_undoes_nothing() -> None:
    class Closed:
        def remaining(self) -> float | None:
            return None

    h = Harness(node("n1", 2))
    placed(h)
    h.api.fail_bind = storage.Fenced("not the leader")

    outcome = await h.scheduler.schedule(P)

    assert outcome.result is Result.RETRY
    assert [w.verb for w in h.api.writes] == ["finalizers", "status"]  # no rollback attempted
    assert h.ctx.state.pods[P].member_of is None


async def test_a_cancelled_placement_rolls_nothing_back() -> None:
    """A deposed leader's decisions are cancelled mid-write: nothing more is sent (the next term rebuilds)."""
    h = Harness(node("n1", 2))
    placed(h)
    started = asyncio.Event()
    release = asyncio.Event()
    real_bind = h.api.bind_pod

    async def hanging_bind(*args: object, **kwargs: object) -> None:
        started.set()
        await release.wait()
        await real_bind(*args, **kwargs)  # type: ignore[arg-type]

    h.api.bind_pod = hanging_bind  # type: ignore[method-assign]
    task = asyncio.get_running_loop().create_task(h.scheduler.schedule(P))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [w.verb for w in h.api.writes] == ["finalizers", "status"]
    assert h.api.groups[G]["status"]["phase"] == "Bound"  # left as the API has it: the next term rebuilds from it


async def test_an_unforeseen_error_from_the_claim_write_keeps_its_devices_as_a_lost_answer_does() -> None:
    """Only errors known not to have applied release a claim: anything else (here an answer nobody could read,
    after the write landed) may hide a landed claim, so its devices stay held until a read-back tells."""
    h = Harness(node("n1", 2))
    placed(h)
    h.see(h.api.add_group("rival", resources={GPU: 2}))
    h.see(h.api.add_pod("r", "rival"))
    landing = h.api.patch_group_status

    async def lands_then_fails(*args: object, **kwargs: object) -> object:
        await landing(*args, **kwargs)  # type: ignore[arg-type]
        raise ValueError("unexpected end of the answer")

    h.api.patch_group_status = lands_then_fails  # type: ignore[method-assign]
    with contextlib.suppress(ValueError):  # the scheduler may let it through: the claim is what matters
        await h.scheduler.schedule(P)
    assert G in h.ctx.unsettled
    held = h.ctx.ledger.allocation(G)
    assert held is not None and held.state is ledgers.AllocationState.RESERVED
    assert (await h.scheduler.schedule(("ns", "r"))).result is Result.UNSCHEDULABLE  # the claim is in the API

    h.api.patch_group_status = landing  # type: ignore[method-assign]
    assert (await h.scheduler.schedule(P)).result is Result.BOUND
    assert [w.verb for w in h.api.writes if w.key in (G, P)] == ["finalizers", "status", "bind"]


async def test_a_member_whose_binding_may_have_landed_stays_ours_when_the_next_try_is_throttled() -> None:
    """A Binding whose answer was lost (it landed) keeps the pod our member; the next cycle's try is throttled
    (429: certainly not applied, but it says nothing of the earlier one): the pod must stay our member, or once
    the watch shows it running the group has no member on its devices and may give them away under it."""
    h = Harness(node("n1", 2))
    placed(h)
    h.api.lose_answer["bind"] = True
    assert (await h.scheduler.schedule(P)).result is Result.RETRY

    h.api.fail_bind = storage.RetryLater("throttled", delay=0.05)
    assert (await h.scheduler.schedule(P)).result is Result.RETRY

    h.see(h.api.pod_now(P, phase="Running"))
    assert [p.name for p in h.ctx.state.members_on_devices(G)] == ["p"]
