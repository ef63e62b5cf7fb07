"""The reconcile queue: a burst of requests is one reconcile per group, later requests come by timer, and a
node's change makes the groups placed on it due.

Time is the event loop's, faked by looptime, so "when" is exact.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from deviceshare.core import claims
from deviceshare.operator.queueing import ReconcileQueue

DEBOUNCE = 0.05
A, B, C = ("ml", "a"), ("ml", "b"), ("dev", "c")


def now() -> float:
    return asyncio.get_running_loop().time()


def allocation(group: tuple[str, str], node: str) -> claims.Allocation:
    return claims.Allocation(group=group, node=node, devices={"nvidia.com/gpu": ("0",)},
                             state=claims.AllocationState.COMMITTED)


def queue(allocations: list[claims.Allocation] | None = None) -> ReconcileQueue:
    return ReconcileQueue(debounce=DEBOUNCE, allocations=lambda: allocations or [])


async def taken(q: ReconcileQueue, within: float) -> set[tuple[str, str]] | None:
    try:
        return await asyncio.wait_for(q.batch(), within)
    except TimeoutError:
        return None


@pytest.mark.looptime
async def test_a_burst_of_requests_is_one_batch_with_each_group_once_after_the_debounce() -> None:
    q = queue()
    start = now()
    for key in (A, B, A, A, B):
        q.request(key)
    assert len(q) == 2
    assert await q.batch() == {A, B}
    assert now() - start == pytest.approx(DEBOUNCE)
    assert len(q) == 0
    assert await taken(q, 10) is None  # nothing more was asked for


@pytest.mark.looptime
async def test_a_request_during_the_debounce_joins_that_batch_and_a_later_one_the_next() -> None:
    q = queue()
    q.request(A)
    batch = asyncio.get_running_loop().create_task(q.batch())
    await asyncio.sleep(DEBOUNCE / 2)  # looptime: exactly half the debounce, in fake time
    q.request(B)
    assert await batch == {A, B}
    q.request(C)
    assert await q.batch() == {C}


@pytest.mark.looptime
async def test_a_later_request_comes_by_timer_and_the_sooner_of_two_timers_wins() -> None:
    q = queue()
    start = now()
    q.request_later(A, 5)
    q.request_later(A, 10)  # later than the timer already set: ignored
    q.request_later(B, 10)
    q.request_later(B, 2)  # sooner: replaces it
    assert await taken(q, 1.9) is None
    assert await q.batch() == {B}
    assert now() - start == pytest.approx(2 + DEBOUNCE)
    assert await q.batch() == {A}
    assert now() - start == pytest.approx(5 + DEBOUNCE)
    assert await taken(q, 20) is None  # each timer fired once: the replaced ones never


@pytest.mark.looptime
async def test_a_node_change_makes_every_group_placed_on_that_node_due_as_the_ledger_shows_now() -> None:
    placed = [allocation(A, "node-1"), allocation(B, "node-2"), allocation(C, "node-1")]
    q = queue(placed)
    q.request_node("node-1")
    assert await q.batch() == {A, C}
    q.request_node("node-3")
    assert await taken(q, 1) is None
    placed.append(allocation(("ml", "new"), "node-3"))  # read when asked, not when the queue was made
    q.request_node("node-3")
    assert await q.batch() == {("ml", "new")}


@pytest.mark.looptime
async def test_clear_drops_what_is_due_and_every_timer() -> None:
    q = queue()
    q.request(A)
    q.request_later(B, 1)
    q.clear()
    assert len(q) == 0
    assert await taken(q, 10) is None
    q.request(C)  # still usable afterwards (a re-elected leader)
    assert await q.batch() == {C}


@pytest.mark.looptime
@pytest.mark.parametrize("seed", range(20))
async def test_every_group_asked_for_later_is_handed_out_once_between_its_soonest_delay_and_a_debounce_after(
    seed: int,
) -> None:
    rng = random.Random(seed)
    q = queue()
    start = now()
    soonest: dict[tuple[str, str], float] = {}
    for _ in range(rng.randint(1, 40)):
        key = ("ns", f"g{rng.randint(0, 9)}")
        delay = round(rng.uniform(0, 3), 3)
        q.request_later(key, delay)
        soonest[key] = min(delay, soonest.get(key, delay))
    handed: dict[tuple[str, str], float] = {}
    while (batch := await taken(q, 10)) is not None:
        for key in batch:
            assert key not in handed, f"{key} handed out twice"
            handed[key] = now() - start
    assert handed.keys() == soonest.keys()
    for key, at in handed.items():
        assert soonest[key] - 1e-6 <= at <= soonest[key] + DEBOUNCE + 1e-6, (key, at, soonest[key])
