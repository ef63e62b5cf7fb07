"""The operator's two work queues: pods waiting for a decision, and groups waiting for a status reconcile.

:class:`SchedulingQueue` is modelled on kube-scheduler's queue. Active pods are handed to workers once each
(no duplicates), in the queue-sort order (kube-scheduler's PrioritySort: the higher group priority first, then
the earlier pod, :func:`deviceshare.core.priority.queue_key`). A pod that could not be placed is parked with a
per-pod exponential backoff; a cluster change that could help (a node added or changed, a group released, a pod
gone) moves every parked pod back once its backoff has passed, and a slow periodic flush catches anything no
event announced. Nothing polls.

:class:`ReconcileQueue` is a due set rather than a FIFO: a group asked for ten times in a burst of member
changes is reconciled once, after a short debounce; a group that must be looked at again later (a release
waiting on a member, a failed write backing off) is asked for by a timer.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar

from deviceshare.core import claims

K = TypeVar("K", bound=Hashable)
GroupKey = tuple[str, str]  # (namespace, name)


class SchedulingQueue(Generic[K]):
    def __init__(
        self,
        *,
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        order: Callable[[K], Any] | None = None,
    ) -> None:
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._clock = clock
        self._order = order  # a key's place when it becomes due (smallest first); None: first come first served
        self._seq = itertools.count()
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self.clear()

    def clear(self) -> None:
        """Forget every pod, due or parked (a deposed leader; its successor rebuilds). No worker may be waiting."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._active: asyncio.PriorityQueue[tuple[Any, int, K]] = asyncio.PriorityQueue()
        self._queued: set[K] = set()
        self._in_flight: set[K] = set()
        self._dirty: set[K] = set()  # re-added while in flight: run once more when it finishes
        self._parked: dict[K, float] = {}  # key -> earliest retry time
        self._attempts: dict[K, int] = {}

    def __len__(self) -> int:
        return len(self._queued) + len(self._in_flight)

    @property
    def parked(self) -> int:
        return len(self._parked)

    def add(self, key: K) -> None:
        """Make ``key`` due for a decision now (no-op if already queued; re-run if in flight)."""
        if key in self._in_flight:
            self._dirty.add(key)
            return
        if key in self._queued:
            return
        self._unpark(key)
        self._queued.add(key)
        self._active.put_nowait((() if self._order is None else self._order(key), next(self._seq), key))

    def forget(self, key: K) -> None:
        """The pod is bound or gone: drop its backoff history."""
        self._unpark(key)
        self._attempts.pop(key, None)
        self._dirty.discard(key)

    async def get(self) -> K:
        while True:
            _, _, key = await self._active.get()
            if key in self._queued:  # skip entries dropped by forget()
                self._queued.discard(key)
                self._in_flight.add(key)
                return key

    def done(self, key: K) -> None:
        self._in_flight.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def park(self, key: K) -> float:
        """Could not place ``key``: retry after its backoff, or sooner via :meth:`move_parked`."""
        attempts = self._attempts.get(key, 0) + 1
        self._attempts[key] = attempts
        delay = float(min(self._backoff_initial * 2 ** (attempts - 1), self._backoff_max))
        self._dirty.discard(key)
        self._parked[key] = self._clock() + delay
        return delay

    def back_off(self, key: K) -> float:
        """A write the API refused: retry after the pod's next backoff even if no cluster event comes."""
        delay = self.park(key)
        self._schedule_timer(key, delay)
        return delay

    def retry_later(self, key: K, delay: float) -> None:
        """A transient failure (API error): try again after ``delay`` regardless of cluster events."""
        self._dirty.discard(key)
        self._parked[key] = self._clock() + delay
        self._schedule_timer(key, delay)

    def move_parked(self) -> int:
        """Something changed that could help: every parked pod is retried once its backoff passed."""
        now = self._clock()
        moved = 0
        for key, due in list(self._parked.items()):
            if due <= now:
                self.add(key)
                moved += 1
            else:
                self._schedule_timer(key, due - now)
        return moved

    def flush(self) -> int:
        """Periodic safety net: every parked pod becomes due, whatever its backoff."""
        keys = list(self._parked)
        for key in keys:
            self.add(key)
        return len(keys)

    def _schedule_timer(self, key: K, delay: float) -> None:
        if key in self._timers:
            return
        loop = asyncio.get_running_loop()
        self._timers[key] = loop.call_later(delay, self._timer_fired, key)

    def _timer_fired(self, key: K) -> None:
        self._timers.pop(key, None)
        if key in self._parked:
            self.add(key)

    def _unpark(self, key: K) -> None:
        self._parked.pop(key, None)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()


class ReconcileQueue:
    """Groups due for a reconcile. :meth:`request` makes one due now; :meth:`batch` hands out everything due,
    once per group, ``debounce`` seconds after the first request (a burst of member changes is one reconcile).

    ``allocations`` is read when a node changes (:meth:`request_node`): the groups placed there are due.
    """

    def __init__(self, *, debounce: float, allocations: Callable[[], Iterable[claims.Allocation]]) -> None:
        self._debounce = debounce
        self._allocations = allocations
        self._due: set[GroupKey] = set()
        self._wakeup = asyncio.Event()
        self._timers: dict[GroupKey, asyncio.TimerHandle] = {}

    def __len__(self) -> int:
        return len(self._due)

    def request(self, key: GroupKey) -> None:
        """Reconcile ``key`` in the next batch."""
        self._due.add(key)
        self._wakeup.set()

    def request_node(self, node: str) -> None:
        """``node`` was lost or came back: every group placed on it needs its status looked at."""
        for allocation in self._allocations():
            if allocation.node == node:
                self.request(allocation.group)

    def request_later(self, key: GroupKey, delay: float) -> None:
        """Reconcile ``key`` after ``delay`` seconds; a timer already set to fire sooner is kept."""
        loop = asyncio.get_running_loop()
        timer = self._timers.get(key)
        if timer is not None:
            if timer.when() <= loop.time() + delay:
                return
            timer.cancel()
        self._timers[key] = loop.call_later(delay, self._timer_fired, key)

    async def batch(self) -> set[GroupKey]:
        """Wait until something is due, let a burst settle for ``debounce`` seconds, and take all of it."""
        await self._wakeup.wait()
        await asyncio.sleep(self._debounce)
        self._wakeup.clear()
        due, self._due = self._due, set()
        return due

    def clear(self) -> None:
        """Nothing is due any more and no timer will fire (a deposed leader; its successor rebuilds)."""
        self._due.clear()
        self._wakeup.clear()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def _timer_fired(self, key: GroupKey) -> None:
        self._timers.pop(key, None)
        self.request(key)
