"""Everything the scheduler, the reconciler and the intake share: created once at start-up by ``startup.py``.

The cluster's picture (ledger, records) is swapped wholesale in one place only, :meth:`Context.adopt`, by the
rebuild; everything else a :class:`Context` holds is set once. Background event posting lives here too.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final

from deviceshare.core import fgdplacement, nominations
from deviceshare.core import ledger as ledgers

from . import drainventory, fleetmetrics, settling, storage, tallies
from . import events as events_
from . import metrics as metrics_
from . import state as state_
from .config import OperatorConfig

logger = logging.getLogger(__name__)

# Events are advisory: a few posters drain them in order, so a burst of placements does not spend its
# CPU and API round trips on them first (kube-scheduler's recorder is asynchronous and bounded too).
EVENT_POSTERS = 4
EVENT_BACKLOG = 10_000


class GroupLocks:
    """One asyncio lock per group: all decisions and status writes of a group happen one at a time."""

    def __init__(self) -> None:
        self._locks: dict[state_.GroupKey, asyncio.Lock] = {}
        self._users: dict[state_.GroupKey, int] = {}

    @asynccontextmanager
    async def hold(self, key: state_.GroupKey) -> AsyncIterator[None]:
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._users[key] = self._users.get(key, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._users[key] -= 1
            if not self._users[key]:  # nobody waits: drop it so deleted groups leave nothing behind
                del self._users[key]
                del self._locks[key]

    def __iter__(self) -> Iterator[state_.GroupKey]:
        return iter(self._locks)


def held_by(ledger: Callable[[], ledgers.DeviceLedger]) -> Callable[[state_.GroupKey], Mapping[str, Any] | None]:
    """What the DRA inventory asks the ledger: the devices a group holds (None: nothing)."""
    def held(group: state_.GroupKey) -> Mapping[str, Any] | None:
        allocation = ledger().allocation(group)
        return None if allocation is None else allocation.devices
    return held


class Context:
    """What the scheduler, the reconciler and the intake share, and who may change what.

    - ``config``, ``api``, ``metrics``, ``locks``, ``recorder``: set at start-up, never replaced.
    - ``ledger``, ``state``, ``fgd``: replaced together only by :meth:`adopt` (the rebuild, ``runtime.py``); in
      between, the ledger and the state records change in place: the intake records what the cluster says,
      the scheduler and the reconciler what they decided and wrote.
    - ``unschedulable``: the scheduler sets a group's reason, the scheduler and the reconciler drop it.
    - ``conflicts``: found by the rebuild (:meth:`adopt`); the reconciler drops a group that released.
    - ``unsettled``: placements whose claim's write ended uncertain (``settling.py``); the scheduler adds, whoever
      holds the group's lock next settles it; a rebuild starts with none.
    """

    def __init__(
        self,
        config: OperatorConfig,
        api: storage.ClusterApi,
        *,
        ledger: ledgers.DeviceLedger | None = None,
        state: state_.ClusterState | None = None,
        metrics: metrics_.Metrics | None = None,
        recorder: events_.EventRecorder | None = None,
    ) -> None:
        self.config: Final = config
        self.api: Final = api
        self.metrics: Final = metrics if metrics is not None else metrics_.Metrics()
        self.locks: Final = GroupLocks()
        # Events are posted in the background so a slow API never holds a group lock; repeats are counted.
        self.recorder: Final = recorder if recorder is not None else events_.EventRecorder()
        # The last reason each Pending group could not be placed, shown in its Scheduled condition (counted by
        # reason kind for the unschedulable-groups gauge).
        self.unschedulable: Final[tallies.Tally[state_.GroupKey, str]] = tallies.Tally(
            lambda key, message: fleetmetrics.waiting_class(message, self._state.groups.get(key))
        )
        # Groups whose devices are also claimed by another group (found at rebuild): key -> other holders.
        self.conflicts: Final[dict[state_.GroupKey, set[state_.GroupKey]]] = {}
        # Placements whose status write's answer was lost: resolved before anything else about the group.
        self.unsettled: Final = settling.Unsettled()
        # Preemption (CONTRACT §8): the room kept for each preemptor (an immutable value, replaced on change) and
        # the victims whose members are being evicted (released by the reconciler once they are gone).
        self.nominations: nominations.Nominations = nominations.NONE
        self.preempted: Final[dict[state_.GroupKey, nominations.Victim]] = {}
        self.background: Final[set[asyncio.Task[None]]] = set()
        self._events: collections.deque[tuple[state_.PodRecord | state_.GroupRecord, str, str, bool]] = (
            collections.deque()
        )
        self._ledger = ledger if ledger is not None else ledgers.DeviceLedger()
        self._state = state if state is not None else state_.ClusterState()
        # Dynamic Resource Allocation (CONTRACT §13): slices, classes and claims' allocations (drainventory.py);
        # replaced with the ledger by :meth:`adopt`. ``dra_served``: the API serves resource.k8s.io/v1.
        self.dra = drainventory.DraInventory(held_by(lambda: self._ledger))
        self.dra_served = False
        # schedulingStrategy fgd: the policy and its target workload, learned from the groups placed.
        self._fgd = fgdplacement.FGDPlacement()
        self.metrics.bind_ledger(self._ledger)
        self.metrics.bind_state(self._state)
        self.metrics.bind_context(self)
        api.on_write = self.metrics.api_write

    @property
    def ledger(self) -> ledgers.DeviceLedger:
        return self._ledger

    @property
    def state(self) -> state_.ClusterState:
        return self._state

    @property
    def fgd(self) -> fgdplacement.FGDPlacement:
        return self._fgd

    def adopt(
        self,
        ledger: ledgers.DeviceLedger,
        state: state_.ClusterState,
        *,
        fgd: fgdplacement.FGDPlacement,
        conflicts: Mapping[state_.GroupKey, set[state_.GroupKey]],
        dra: drainventory.DraInventory | None = None,
        dra_served: bool = False,
    ) -> None:
        """Replace everything known about the cluster with a rebuild's result, in one step (no await)."""
        self._ledger, self._state, self._fgd = ledger, state, fgd
        self.dra = dra if dra is not None else drainventory.DraInventory(held_by(lambda: ledger))
        self.dra_served = dra_served
        self.metrics.bind_ledger(ledger)
        self.metrics.bind_state(state)
        self.conflicts.clear()
        self.conflicts.update(conflicts)
        self.unschedulable.clear()
        self.unsettled.clear()
        self.nominations = nominations.NONE  # a new term decides again from what the API shows
        self.preempted.clear()

    def event(
        self, obj: state_.PodRecord | state_.GroupRecord, reason: str, message: str, *, warning: bool = False
    ) -> None:
        if len(self._events) >= EVENT_BACKLOG:
            dropped = self._events.popleft()
            logger.warning("event backlog full; dropped %s for %s/%s", dropped[1], *dropped[0].key)
        self._events.append((obj, reason, message, warning))
        if sum(not t.done() for t in self.background) < EVENT_POSTERS:
            task = asyncio.get_running_loop().create_task(self._post_events())
            self.background.add(task)
            task.add_done_callback(self.background.discard)

    async def drain(self) -> None:
        """Wait for background event posts (at shutdown, and in tests)."""
        while self.background:
            await asyncio.gather(*list(self.background), return_exceptions=True)

    async def _post_events(self) -> None:
        while self._events:
            await self._post_event(*self._events.popleft())

    async def _post_event(
        self, obj: state_.PodRecord | state_.GroupRecord, reason: str, message: str, warning: bool
    ) -> None:
        is_pod = isinstance(obj, state_.PodRecord)
        await self.recorder.record(
            self.api,
            kind="Pod" if is_pod else "SharedDeviceGroup",
            api_version="v1" if is_pod else "deviceshare.io/v1alpha1",
            namespace=obj.key[0],
            name=obj.key[1],
            uid=obj.uid,
            reason=reason,
            message=message,
            type_="Warning" if warning else "Normal",
            component=self.config.scheduler_name,
        )
