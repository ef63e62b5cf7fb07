"""Everything the scheduler and the reconciler share, created once at start-up (kept in Kopf's memo)."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

from deviceshare.core import fgdplacement
from deviceshare.core import ledger as ledgers

from . import events as events_
from . import metrics as metrics_
from . import state as state_
from . import storage
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


@dataclasses.dataclass
class Context:
    config: OperatorConfig
    api: storage.ClusterApi
    ledger: ledgers.DeviceLedger = dataclasses.field(default_factory=ledgers.DeviceLedger)
    state: state_.ClusterState = dataclasses.field(default_factory=state_.ClusterState)
    metrics: metrics_.Metrics = dataclasses.field(default_factory=metrics_.Metrics)
    locks: GroupLocks = dataclasses.field(default_factory=GroupLocks)
    # The last reason each Pending group could not be placed, shown in its Scheduled condition.
    unschedulable: dict[state_.GroupKey, str] = dataclasses.field(default_factory=dict)
    # Groups whose devices are also claimed by another group (found at rebuild): key -> other holders.
    conflicts: dict[state_.GroupKey, set[state_.GroupKey]] = dataclasses.field(default_factory=dict)
    # Events are posted in the background so a slow API never holds a group lock; repeats are counted.
    # schedulingStrategy fgd: the policy and its target workload, learned from the groups placed.
    fgd: fgdplacement.FGDPlacement = dataclasses.field(default_factory=fgdplacement.FGDPlacement)
    recorder: events_.EventRecorder = dataclasses.field(default_factory=events_.EventRecorder)
    background: set[asyncio.Task[None]] = dataclasses.field(default_factory=set)
    _events: collections.deque[tuple[state_.PodRecord | state_.GroupRecord, str, str, bool]] = dataclasses.field(
        default_factory=collections.deque
    )

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
