"""A list+watch loop that mirrors one kind of object into memory (client-go's reflector, small).

Callers that must answer fast (the admission webhook answers within its timeout on every pod
creation) cannot afford one API call per question; they keep a local copy instead. The loop lists
once, then watches from the list's ``resourceVersion``, resumes from the last version it saw when a
watch ends or breaks, relists when the server says that version has expired (410 Gone), and backs
off exponentially while the API server is unreachable. What the copy means is the caller's business:
it receives the full list (``replace``) and every change (``apply``) through a :class:`Sink`.

A list in several pages is read at the first page's resourceVersion (kube-apiserver serves every page from
that snapshot), so the watch starts from there as soon as the first page is in, *beside* the rest of the list:
a relist of 150,000 pods takes tens of seconds, and a pod created meanwhile is seen (and scheduled) at once
rather than after the last page. A change the watch brings is newer than anything in the list, so the list's
own copy of that object is dropped when its page comes; the objects the watch added are handed over as a last
page, so that the end of the list does not take them for deleted. A server that ignores ``limit`` answers with the
whole list in one body: its items are decoded a page's worth at a time as they are handed over (``listbodies``).

Objects are plain dicts as the API sends them; list items carry no ``kind``/``apiVersion``. Lists and
watch lines are decoded by orjson (the operator's and the webhook's most frequent decoding: every event).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import aiohttp
import orjson

from . import listbodies

logger = logging.getLogger(__name__)

Object = Mapping[str, Any]
# A kubernetes_asyncio list function with its positional arguments and selectors already bound,
# e.g. ``functools.partial(CoreV1Api(c).list_pod_for_all_namespaces, label_selector="x")``.
ListCall = Callable[..., Awaitable[Any]]


class Sink(Protocol):
    """Receives a mirrored collection."""

    def replace(self, objects: list[Object], resource_version: str | None = None) -> None:
        """The complete current collection (after every list, including relists), as of the list's
        ``resource_version`` (None when the API sent none)."""

    def apply(self, event_type: str, obj: Object) -> None:
        """One change: ``ADDED``, ``MODIFIED`` or ``DELETED``."""


@runtime_checkable
class PagedSink(Protocol):
    """A sink that takes a list page by page, so a relist of 150,000 pods never sits in memory whole: ``begin``,
    then ``page`` for each page in order, then ``end`` with the list's resourceVersion (together what ``replace``
    does with the whole list). A list that fails midway ends without ``end``; the next one begins again."""

    def begin(self) -> None: ...

    def page(self, objects: list[Object]) -> None: ...

    def end(self, resource_version: str | None) -> None: ...


class Expired(Exception):
    """The resourceVersion we resume from is too old (HTTP 410 Gone): relist."""


class ApiUnavailable(Exception):
    """The API server answered with an error status, or not at all: retry after a pause."""


@dataclass
class Backoff:
    """Exponential backoff with jitter between failed attempts."""

    initial: float = 0.2
    cap: float = 10.0
    attempts: int = 0

    def next_delay(self) -> float:
        delay = min(self.cap, self.initial * 2**self.attempts)
        self.attempts += 1
        return float(delay * random.uniform(0.5, 1.0))

    def reset(self) -> None:
        self.attempts = 0


_Item = TypeVar("_Item")


@dataclass(frozen=True)
class Listing(Generic[_Item]):
    """A whole collection as one list returned it: its items (the objects, or what the caller made of each), and
    the resourceVersion it is a picture of (a watch started from that version misses nothing that happened after
    the list)."""

    items: list[_Item]
    resource_version: str | None


class Reflector:
    """Keeps a :class:`Sink` in step with one collection until cancelled; see the module docstring.

    ``resume_from``: the caller has already listed the collection at that resourceVersion (and handed the list
    to the sink itself): watch from there, with no list of our own first, as client-go's informers do after
    their initial list. Nothing that happened after the caller's list is missed, and nothing is listed twice.
    """

    def __init__(
        self,
        list_call: ListCall,
        sink: Sink,
        *,
        name: str,
        watch_timeout_s: int = 300,
        request_timeout_s: float = 30.0,
        idle_timeout_s: float = 65.0,
        page_size: int = 500,
        backoff: Backoff | None = None,
        resume_from: str | None = None,
    ) -> None:
        self._list_call = list_call
        self._sink = sink
        self.name = name
        self._watch_timeout_s = watch_timeout_s
        self._request_timeout_s = request_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._page_size = page_size
        self._backoff = backoff or Backoff()
        self.synced = asyncio.Event()
        self.resource_version: str | None = resume_from
        self.relists = 0
        # While a list is being paged in with the watch already running: what the watch brought, by key (None:
        # deleted); that watch, which goes on once the list has ended.
        self._live: dict[tuple[str, str], Object | None] | None = None
        self._watching: asyncio.Task[None] | None = None
        if resume_from is not None:
            self.synced.set()

    async def wait_synced(self, timeout_s: float) -> bool:
        """Whether the first list has arrived, waiting at most ``timeout_s``."""
        if not self.synced.is_set():
            try:
                await asyncio.wait_for(self.synced.wait(), timeout_s)
            except TimeoutError:
                return False
        return True

    async def run(self) -> None:
        while True:
            try:
                if self.resource_version is None:
                    await self._list()
                watching, self._watching = self._watching, None
                await (watching if watching is not None else self._watch())
            except asyncio.CancelledError:
                raise
            except Expired:
                logger.info("%s: resourceVersion %s expired; relisting", self.name, self.resource_version)
                self.resource_version = None
            except Exception as e:
                delay = self._backoff.next_delay()
                logger.warning("%s: %s; retrying in %.1fs", self.name, _describe(e), delay)
                await asyncio.sleep(delay)

    async def _list(self) -> None:
        paged = self._sink if isinstance(self._sink, PagedSink) else None
        items: list[Object] = []
        token: str | None = None
        started, count = time.monotonic(), 0
        if paged is not None:
            paged.begin()
        try:
            while True:
                kwargs: dict[str, Any] = {"limit": self._page_size}
                if token:
                    kwargs["_continue"] = token
                body: listbodies.ListBody = await self._request(kwargs, self._request_timeout_s, read_body=True)
                meta = body.head.get("metadata")  # None: written after the items (a custom resource's list)
                if meta is not None:
                    self._beside(meta)
                # A server that ignores ``limit`` sends the whole list at once: handed over in pages all the same,
                # each decoded as it is handed over, the workers let run between them.
                for found in _batched(body.items(), self._page_size):
                    count += len(found)
                    if self._live:
                        found = [o for o in found if _key(o) not in self._live]  # the watch has a newer one
                    if paged is not None:
                        paged.page(found)  # handed over at once: no page waits for the last one
                        await asyncio.sleep(0)
                    else:
                        items.extend(found)
                    del found
                if meta is None:
                    meta = body.head.get("metadata") or {}
                    self._beside(meta)
                token = meta.get("continue")
                del body
                if not token:
                    break
            version = str(meta.get("resourceVersion") or "") or None
            added = [o for o in (self._live or {}).values() if o is not None]
            if paged is not None:
                if added:
                    paged.page(added)
                paged.end(version)
            else:
                self._sink.replace(items + added, version)
        except BaseException:
            watching, self._watching = self._watching, None
            if watching is not None:
                watching.cancel()
                watching.add_done_callback(_retrieve)  # its own failure, if any, is not this list's
            raise
        finally:
            self._live = None
        if self._watching is None:
            self.resource_version = version
        logger.info("%s: listed %d objects in %.2fs (resourceVersion %s)", self.name, count,
                    time.monotonic() - started, version)
        self.relists += 1
        self._backoff.reset()
        self.synced.set()

    def _beside(self, meta: Mapping[str, Any]) -> None:
        """More pages to come (``meta`` has a continue token): watch meanwhile, from the list's resourceVersion."""
        if meta.get("continue") and self._watching is None and meta.get("resourceVersion"):
            self._watch_beside(str(meta["resourceVersion"]))

    def _watch_beside(self, version: str) -> None:
        """Starts watching from the list's ``version`` while its next pages are read; a watch that ends meanwhile
        (its timeout) is started again from the last version it saw, one that fails is left for ``run``."""
        self._live = {}
        self.resource_version = version

        async def watch() -> None:
            while self._live is not None:
                await self._watch()

        self._watching = asyncio.create_task(watch(), name=f"{self.name}: watch beside the list")

    async def _watch(self) -> None:
        kwargs: dict[str, Any] = {
            "watch": True,
            "allow_watch_bookmarks": True,
            "timeout_seconds": self._watch_timeout_s,
        }
        if self.resource_version:
            kwargs["resource_version"] = self.resource_version
        # The server ends the watch after timeout_seconds, and sends a bookmark every minute meanwhile (kube-
        # apiserver's cacher; the sandbox more often): a watch silent for longer than ``idle_timeout_s`` is on a
        # dead connection (no FIN, no RST: a node or a load balancer's flow gone), dropped and resumed from the
        # last resourceVersion seen, on a new connection. client-go finds it by HTTP/2 pings (30 s + 15 s).
        resp = await self._request(kwargs, min(self._idle_timeout_s, self._watch_timeout_s + 30), read_body=False)
        complete = False
        try:
            buffer = b""
            async for chunk in resp.content.iter_any():
                if buffer:
                    chunk = buffer + chunk
                *lines, buffer = chunk.split(b"\n")
                for line in lines:
                    if line.strip():
                        self._event(orjson.loads(line))
                        self._backoff.reset()
            complete = True
        finally:
            if complete:
                resp.release()
            else:
                resp.close()  # broken off (silent, failed, cancelled): its connection is never reused

    def _event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Expired(obj.get("message", ""))
            raise ApiUnavailable(f"watch error {obj.get('code')}: {obj.get('message')}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            if self._live is not None:
                self._live[_key(obj)] = None if kind == "DELETED" else obj
            self._sink.apply(kind, obj)
        if version:
            self.resource_version = str(version)

    async def _request(self, kwargs: dict[str, Any], timeout_s: float, *, read_body: bool) -> Any:
        timeout = aiohttp.ClientTimeout(total=None if not read_body else timeout_s, sock_read=timeout_s,
                                        sock_connect=min(timeout_s, 10.0))
        resp = await self._list_call(**kwargs, _preload_content=False, _request_timeout=timeout)
        if resp.status == 410:
            resp.release()
            raise Expired("list continue token or resourceVersion expired")
        if not 200 <= resp.status < 300:
            text = await resp.text()
            resp.release()
            raise ApiUnavailable(f"HTTP {resp.status}: {text[:200]}")
        if not read_body:
            return resp
        try:
            return listbodies.ListBody(await resp.read())
        finally:
            resp.release()


def _batched(objects: Iterator[Object], size: int) -> Iterator[list[Object]]:
    """``objects`` in lists of ``size`` (the last one shorter), each taken from ``objects`` only when asked for."""
    while batch := list(itertools.islice(objects, size)):
        yield batch


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


def _key(obj: Object) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
