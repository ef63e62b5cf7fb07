"""The watch history: every stored change as a watch event, kept for resuming, and the open watches.

A watch that resumes from a resourceVersion gets the events after it from here; one older than
what is kept gets 410 Gone, as after etcd compaction. It is apart from the object store because it
knows nothing of objects or write rules: the store hands it each event once the write is done.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Callable
from functools import cached_property
from typing import Any

import orjson

from deviceshare.sandbox import errors

Obj = dict[str, Any]
Key = tuple[str, str]  # (group, plural)


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    rv: int
    key: Key
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj
    old: Obj | None = None

    @cached_property
    def line(self) -> bytes:
        return orjson.dumps({"type": self.type, "object": self.obj}) + b"\n"


@dataclasses.dataclass(eq=False)
class Subscription:
    key: Key
    queue: asyncio.Queue[WatchEvent | None] = dataclasses.field(default_factory=asyncio.Queue)
    closed: bool = False  # the server ended this watch: undelivered events are dropped


class WatchHistory:
    """The last ``limit`` events in resourceVersion order, the open subscriptions, and in-process listeners."""

    def __init__(self, limit: int) -> None:
        self._events: collections.deque[WatchEvent] = collections.deque()
        self._limit = limit
        self._compacted = 0
        self._subscriptions: list[Subscription] = []
        self.listeners: list[Callable[[WatchEvent], None]] = []

    def subscribe(self, key: Key, since: int | None) -> tuple[Subscription, list[WatchEvent]]:
        """Start receiving events of a resource; with ``since``, also those after that version.

        A version older than the retained history is answered 410 Gone, as etcd compaction does.
        """
        backlog: list[WatchEvent] = []
        if since is not None:
            if since < self._compacted:
                raise errors.gone(f"too old resource version: {since} ({self._compacted + 1})")
            backlog = [e for e in self._events if e.rv > since and e.key == key]
        sub = Subscription(key)
        self._subscriptions.append(sub)
        return sub, backlog

    def unsubscribe(self, sub: Subscription) -> None:
        if sub in self._subscriptions:
            self._subscriptions.remove(sub)

    def subscriptions(self, key: Key | None = None) -> list[Subscription]:
        return [sub for sub in self._subscriptions if key is None or sub.key == key]

    def close_watches(self) -> int:
        """End every open watch (the clients see the stream close and re-watch)."""
        subs, self._subscriptions = self._subscriptions, []
        for sub in subs:
            sub.closed = True
            sub.queue.put_nowait(None)
        return len(subs)

    def compact(self, rv: int) -> None:
        """Forget the events, so any resourceVersion older than ``rv`` gets 410 Gone."""
        self._events.clear()
        self._compacted = rv

    def record(self, event: WatchEvent) -> None:
        """Keep an event and hand it to every watch of its resource and every listener."""
        self._events.append(event)
        while len(self._events) > self._limit:
            self._compacted = self._events.popleft().rv
        for sub in self._subscriptions:
            if sub.key == event.key:
                sub.queue.put_nowait(event)
        for listener in list(self.listeners):
            listener(event)
