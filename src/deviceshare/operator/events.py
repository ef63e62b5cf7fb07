"""Kubernetes Events the way client-go's recorder posts them: a repeat is counted, not posted anew.

A pod that stays unschedulable is retried with backoff and gets the same ``FailedScheduling`` message
each time; kube-scheduler's recorder (client-go's ``EventCorrelator``) then bumps ``count`` and
``lastTimestamp`` on the Event it already posted, so ``kubectl describe`` shows ``(x12 over 5m)`` instead of
twelve lines, and etcd holds one object. Same key as client-go's: the involved object, type, reason,
message and the reporting component; an LRU of recent keys (client-go keeps 4096). If the Event has
expired meanwhile (the API answers 404), a new one is posted.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses

from . import storage

CACHE_SIZE = 4096

EventKey = tuple[str, str, str, str, str, str, str, str]  # kind, ns, name, uid, type, reason, message, component


@dataclasses.dataclass
class _Seen:
    name: str | None = None  # None until its first post answered (or when that failed)
    count: int = 0
    # Set once the first post answered: a repeat that arrives meanwhile (several posters run at once)
    # waits for it, and counts, instead of posting a twin.
    posted: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


class EventRecorder:
    """Posts or counts Events through :class:`storage.ClusterApi` (best effort, as events are)."""

    def __init__(self, cache_size: int = CACHE_SIZE) -> None:
        self._seen: collections.OrderedDict[EventKey, _Seen] = collections.OrderedDict()
        self._cache_size = cache_size

    async def record(
        self,
        api: storage.ClusterApi,
        *,
        kind: str,
        api_version: str,
        namespace: str,
        name: str,
        uid: str,
        reason: str,
        message: str,
        type_: str,
        component: str,
    ) -> None:
        key: EventKey = (kind, namespace, name, uid, type_, reason, message, component)

        async def post() -> str | None:
            return await api.emit_event(
                kind=kind, api_version=api_version, namespace=namespace, name=name, uid=uid,
                reason=reason, message=message, type_=type_, component=component,
            )

        seen = self._seen.get(key)
        if seen is None:
            seen = self._seen[key] = _Seen()
            while len(self._seen) > self._cache_size:
                self._seen.popitem(last=False)
            try:
                seen.name, seen.count = await post(), 1
            finally:
                seen.posted.set()
            return
        self._seen.move_to_end(key)
        await seen.posted.wait()
        seen.count += 1
        if seen.name is not None and await api.count_event(namespace, seen.name, seen.count):
            return
        # Never posted, or expired since: a fresh Event.
        seen.name, seen.count = await post(), 1
