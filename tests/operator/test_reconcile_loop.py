"""The group reconciler's loop (reconcileloop.py): what happens when a reconcile fails.

A fake reconciler stands in for ``GroupReconciler`` and a fake API answers the loop's re-read; time is the
event loop's, faked by looptime, so the delays between tries are exact. The reconciles themselves are tested
end to end (test_group_status.py, test_recovery.py) and against a fake API (the scheduler's and reconciler's
unit tests).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from deviceshare.operator import reconcileloop, state, storage
from deviceshare.operator.config import OperatorConfig
from deviceshare.operator.context import Context
from deviceshare.operator.queueing import ReconcileQueue

DEBOUNCE = 0.05
INITIAL, MAX, ERROR = 0.1, 1.6, 1.0
A, B = ("ml", "a"), ("ml", "b")


def group_body(key: tuple[str, str], version: int) -> dict[str, Any]:
    return {
        "apiVersion": "deviceshare.io/v1alpha1", "kind": "SharedDeviceGroup",
        "metadata": {"namespace": key[0], "name": key[1], "uid": f"uid-{key[1]}", "resourceVersion": str(version),
                     "generation": 1},
        "spec": {"resources": {"nvidia.com/gpu": 1}},
    }


class FakeApi:
    """The one call the loop makes itself: the group read again after a conflict."""

    def __init__(self) -> None:
        self.version = 100
        self.reads: list[tuple[str, str]] = []
        self.gone: set[tuple[str, str]] = set()
        self.down = False  # every read fails as an unreachable API server's would

    async def read_group(self, key: tuple[str, str]) -> state.GroupRecord:
        self.reads.append(key)
        if self.down:
            raise OSError("connection refused")
        if key in self.gone:
            raise storage.Gone("404")
        self.version += 1
        return state.group_record(group_body(key, self.version))


class FakeReconciler:
    """Fails as told (one exception per call, in order), then succeeds; records when each call came."""

    def __init__(self, failures: dict[tuple[str, str], list[BaseException]], *, releases: bool = False) -> None:
        self.failures = failures
        self.releases = releases
        self.calls: dict[tuple[str, str], list[float]] = {}
        self.done = asyncio.Event()
        self.block: asyncio.Event | None = None  # when set: every reconcile waits on it
        self.cancelled = 0

    async def reconcile(self, gkey: tuple[str, str]) -> bool:
        self.calls.setdefault(gkey, []).append(asyncio.get_running_loop().time())
        if self.block is not None:
            try:
                await self.block.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        pending = self.failures.get(gkey)
        if pending:
            raise pending.pop(0)
        self.done.set()
        return self.releases


class Harness:
    def __init__(self, reconciler: FakeReconciler) -> None:
        self.api = FakeApi()
        self.ctx = Context(OperatorConfig(), api=self.api)  # type: ignore[arg-type]
        self.queue = ReconcileQueue(debounce=DEBOUNCE, allocations=list)
        self.released = 0
        self.reconciler = reconciler
        self.loop = reconcileloop.ReconcileLoop(
            self.ctx, reconciler, self.queue, released=self._released, concurrency=4,
            backoff_initial=INITIAL, backoff_max=MAX, error_delay=ERROR,
        )

    def _released(self) -> None:
        self.released += 1


@pytest.fixture
async def running() -> AsyncIterator[Callable[[FakeReconciler], Harness]]:
    tasks: list[asyncio.Task[None]] = []

    def start(reconciler: FakeReconciler) -> Harness:
        harness = Harness(reconciler)
        tasks.append(asyncio.get_running_loop().create_task(harness.loop.run()))
        return harness

    yield start
    for task in tasks:
        assert not task.done(), "the loop ended"
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def gaps(times: list[float]) -> list[float]:
    return [round(b - a, 6) for a, b in itertools.pairwise(times)]


@pytest.mark.looptime
async def test_a_conflict_reads_the_group_again_and_retries_with_a_delay_that_doubles(
    running: Callable[[FakeReconciler], Harness],
) -> None:
    fake = FakeReconciler({A: [storage.Conflict("409") for _ in range(4)]})
    h = running(fake)
    h.ctx.state.upsert_group(state.group_record(group_body(A, 1)))  # our stale copy
    h.queue.request(A)
    await asyncio.wait_for(fake.done.wait(), 30)
    # Each retry waits its backoff, then the queue's debounce: 0.1, 0.2, 0.4, 0.8 s.
    assert gaps(fake.calls[A]) == pytest.approx([d + DEBOUNCE for d in (0.1, 0.2, 0.4, 0.8)])
    assert h.api.reads == [A] * 4
    assert h.ctx.state.groups[A].resource_version == "104"  # the retry works on what the API has now
    assert h.loop.failures == {}  # a success starts the count over


@pytest.mark.looptime
async def test_the_backoff_is_capped_and_counted_per_group(running: Callable[[FakeReconciler], Harness]) -> None:
    fake = FakeReconciler({A: [storage.Conflict("409") for _ in range(7)], B: [storage.Conflict("409")]})
    h = running(fake)
    h.queue.request(A)
    h.queue.request(B)
    await asyncio.wait_for(fake.done.wait(), 1)  # B succeeds on its second try, whatever A does
    assert gaps(fake.calls[B]) == pytest.approx([INITIAL + DEBOUNCE])
    while len(fake.calls[A]) < 8:
        await asyncio.sleep(0.5)  # looptime: fake seconds pass at once
    assert gaps(fake.calls[A]) == pytest.approx([d + DEBOUNCE for d in (0.1, 0.2, 0.4, 0.8, 1.6, 1.6, 1.6)])


@pytest.mark.looptime
async def test_a_gone_group_is_forgotten_and_reconciled_again(running: Callable[[FakeReconciler], Harness]) -> None:
    fake = FakeReconciler({A: [storage.Gone("404")]}, releases=True)
    h = running(fake)
    h.ctx.state.upsert_group(state.group_record(group_body(A, 1)))
    h.queue.request(A)
    await asyncio.wait_for(fake.done.wait(), 5)
    assert A not in h.ctx.state.groups  # the retry does what a deleted group needs
    assert len(fake.calls[A]) == 2
    assert h.released == 1  # devices given back: parked pods are told


@pytest.mark.looptime
async def test_a_conflict_on_a_group_deleted_since_forgets_it(running: Callable[[FakeReconciler], Harness]) -> None:
    fake = FakeReconciler({A: [storage.Conflict("409")]})
    h = running(fake)
    h.ctx.state.upsert_group(state.group_record(group_body(A, 1)))
    h.api.gone.add(A)
    h.queue.request(A)
    await asyncio.wait_for(fake.done.wait(), 5)
    assert A not in h.ctx.state.groups


@pytest.mark.looptime
async def test_a_conflict_whose_read_again_fails_is_still_retried(running: Callable[[FakeReconciler], Harness]) -> None:
    fake = FakeReconciler({A: [storage.Conflict("409"), storage.Conflict("409")]})
    h = running(fake)
    h.ctx.state.upsert_group(state.group_record(group_body(A, 1)))
    h.api.down = True
    h.queue.request(A)
    await asyncio.wait_for(fake.done.wait(), 5)
    assert len(fake.calls[A]) == 3 and h.api.reads == [A, A]
    assert h.ctx.state.groups[A].resource_version == "1"  # nothing better was known


@pytest.mark.looptime
async def test_an_unexpected_error_is_logged_with_its_traceback_and_retried_and_the_loop_lives_on(
    running: Callable[[FakeReconciler], Harness], caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeReconciler({A: [RuntimeError("a bug"), RuntimeError("a bug")]})
    h = running(fake)
    with caplog.at_level(logging.ERROR, logger=reconcileloop.__name__):
        h.queue.request(A)
        await asyncio.wait_for(fake.done.wait(), 10)
    # Not at once, as a conflict is (its backoff would be 0.1, then 0.2 s): no sooner than the error delay.
    assert gaps(fake.calls[A]) == pytest.approx([ERROR + DEBOUNCE, ERROR + DEBOUNCE])
    failed = [r for r in caplog.records if "reconciling group ml/a failed" in r.getMessage()]
    assert len(failed) == 2 and all(r.exc_info and r.exc_info[0] is RuntimeError for r in failed)
    fake.done.clear()
    h.queue.request(B)  # still serving
    await asyncio.wait_for(fake.done.wait(), 1)


@pytest.mark.looptime
async def test_stopping_the_loop_cancels_the_reconciles_in_flight() -> None:
    fake = FakeReconciler({})
    fake.block = asyncio.Event()
    h = Harness(fake)
    task = asyncio.get_running_loop().create_task(h.loop.run())
    h.queue.request(A)
    h.queue.request(B)
    while len(fake.calls) < 2:
        await asyncio.sleep(0.01)  # looptime: fake seconds pass at once
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert fake.cancelled == 2  # a deposed leader writes nothing more
