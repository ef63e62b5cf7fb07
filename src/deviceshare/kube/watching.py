"""A list+watch loop that mirrors one kind of object into memory (client-go's reflector, small).

Callers that must answer fast (the admission webhook answers within its timeout on every pod
creation) cannot afford one API call per question; they keep a local copy instead. The loop lists
once, then watches from the list's ``resourceVersion``, resumes from the last version it saw when a
watch ends or breaks, relists when the server says that version has expired (410 Gone), and backs
off exponentially while the API server is unreachable. What the copy means is the caller's business:
it receives the full list (``replace``) and every change (``apply``) through a :class:`Sink`.

Objects are plain dicts as the API sends them; list items carry no ``kind``/``apiVersion``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

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


@dataclass(frozen=True)
class Listing:
    """A whole collection as one list returned it: its items, and the resourceVersion it is a picture of (a
    watch started from that version misses nothing that happened after the list)."""

    items: list[dict[str, Any]]
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
        page_size: int = 500,
        backoff: Backoff | None = None,
        resume_from: str | None = None,
    ) -> None:
        self._list_call = list_call
        self._sink = sink
        self.name = name
        self._watch_timeout_s = watch_timeout_s
        self._request_timeout_s = request_timeout_s
        self._page_size = page_size
        self._backoff = backoff or Backoff()
        self.synced = asyncio.Event()
        self.resource_version: str | None = resume_from
        self.relists = 0
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
                await self._watch()
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
        items: list[Object] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": self._page_size}
            if token:
                kwargs["_continue"] = token
            body = await self._request(kwargs, self._request_timeout_s, read_body=True)
            items.extend(body.get("items") or [])
            meta = body.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                break
        self.resource_version = str(meta.get("resourceVersion") or "") or None
        self._sink.replace(items, self.resource_version)
        self.relists += 1
        self._backoff.reset()
        self.synced.set()

    async def _watch(self) -> None:
        kwargs: dict[str, Any] = {
            "watch": True,
            "allow_watch_bookmarks": True,
            "timeout_seconds": self._watch_timeout_s,
        }
        if self.resource_version:
            kwargs["resource_version"] = self.resource_version
        # The server ends the watch after timeout_seconds; the client gives it some slack.
        resp = await self._request(kwargs, self._watch_timeout_s + 30, read_body=False)
        try:
            buffer = b""
            async for chunk in resp.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        self._event(json.loads(line))
                        self._backoff.reset()
        finally:
            resp.release()

    def _event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Expired(obj.get("message", ""))
            raise ApiUnavailable(f"watch error {obj.get('code')}: {obj.get('message')}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self._sink.apply(kind, obj)
        if version:
            self.resource_version = str(version)

    async def _request(self, kwargs: dict[str, Any], timeout_s: float, *, read_body: bool) -> Any:
        timeout = aiohttp.ClientTimeout(total=None if not read_body else timeout_s, sock_read=timeout_s)
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
            return await resp.json(content_type=None)
        finally:
            resp.release()


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
