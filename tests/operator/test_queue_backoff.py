"""A pod whose write the API refused comes back by itself after its backoff (no cluster event needed).

Time is the event loop's, faked by looptime: "not before its backoff" and "by then" are exact, whatever
the machine's speed.
"""

from __future__ import annotations

import asyncio

import pytest

from deviceshare.operator.queueing import SchedulingQueue

pytestmark = pytest.mark.looptime


async def _taken(queue: SchedulingQueue[str], within: float) -> str | None:
    try:
        return await asyncio.wait_for(queue.get(), within)
    except TimeoutError:
        return None


async def test_back_off_retries_on_its_own_and_doubles() -> None:
    queue: SchedulingQueue[str] = SchedulingQueue(backoff_initial=0.05, backoff_max=1.0)
    queue.add("p")
    assert await queue.get() == "p"
    queue.done("p")
    assert queue.back_off("p") == pytest.approx(0.05)
    assert await _taken(queue, 0.02) is None  # not before its backoff
    assert await _taken(queue, 0.5) == "p"
    queue.done("p")
    assert queue.back_off("p") == pytest.approx(0.1)  # the next refusal waits longer
    assert await _taken(queue, 0.5) == "p"


async def test_a_parked_pod_waits_for_a_cluster_change_but_a_refused_one_does_not() -> None:
    queue: SchedulingQueue[str] = SchedulingQueue(backoff_initial=0.01, backoff_max=1.0)
    for key in ("parked", "refused"):
        queue.add(key)
        assert await queue.get() == key
        queue.done(key)
    queue.park("parked")
    queue.back_off("refused")
    assert await _taken(queue, 0.3) == "refused"
    assert await _taken(queue, 0.1) is None
