"""Whole collections read page by page (``limit`` / ``continue``), each page turned into records as it arrives.

A rebuild at Kubernetes' envelope lists 150,000 pods: read at once, their JSON (230 MiB) and the dicts parsed from
it (several times that) sat in memory together before the first record was made, and the operator's RSS never came
back down (1.4 GiB measured, see docs/benchmarks.md). Page by page, only one page of dicts lives at a time: each is
handed to ``transform`` (``state.pod_record``, ``state.group_record``...) and dropped. The list's resourceVersion
is the one its pages are read at (kube-apiserver serves every page at the first page's), so a watch resumed from
it misses nothing. A continue token that expires midway (410) starts the list again, a few times at most. A server
that ignores ``limit`` (kube-apiserver's watch cache at resourceVersion=0) sends the whole list in one body: its
items are decoded one at a time (``kube/listbodies.py``), so even then one item's dicts live at a time, beside the
body's bytes. A body that is not a list (a proxy's error page answered 200, bytes mangled on the way) is
``RetryLater``, as any other failed read: the list is asked for again, never half-taken.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, overload
from urllib.parse import quote

from deviceshare.api import names
from deviceshare.kube import listbodies, watching

from .errors import Expired, RetryLater
from .transport import Transport

PAGE = 2000  # objects per page: ~3 MiB of pods, a handful of milliseconds to decode
RESTARTS = 3


T = TypeVar("T")
Body = dict[str, Any]


class Collections(Transport):
    """Every node, pod and group, page by page; with ``transform``, each made into what it returns as its page
    arrives (``state.pod_record``, ``inventory.node_from_object``...), the bodies dropped page by page."""

    @overload
    async def list_nodes(self) -> watching.Listing[Body]: ...
    @overload
    async def list_nodes(self, transform: Callable[[Body], T]) -> watching.Listing[T]: ...
    async def list_nodes(self, transform: Callable[[Body], Any] | None = None) -> watching.Listing[Any]:
        return await self._list("/api/v1/nodes", "list nodes", transform)

    @overload
    async def list_pods(self) -> watching.Listing[Body]: ...
    @overload
    async def list_pods(self, transform: Callable[[Body], T]) -> watching.Listing[T]: ...
    async def list_pods(self, transform: Callable[[Body], Any] | None = None) -> watching.Listing[Any]:
        return await self._list("/api/v1/pods", "list pods", transform)

    @overload
    async def list_groups(self) -> watching.Listing[Body]: ...
    @overload
    async def list_groups(self, transform: Callable[[Body], T]) -> watching.Listing[T]: ...
    async def list_groups(self, transform: Callable[[Body], Any] | None = None) -> watching.Listing[Any]:
        return await self._list(f"/apis/{names.API_VERSION}/{names.PLURAL}", "list shareddevicegroups", transform)

    async def _list(
        self, path: str, what: str, transform: Callable[[Body], Any] | None = None, *, page: int = PAGE
    ) -> watching.Listing[Any]:
        """Every object at ``path`` (a collection), each through ``transform`` (``None``: kept as it is). The pages
        in order; the next one is asked for as soon as a page's metadata is in, so the server (another process)
        prepares and sends it while this one makes records of the last. A 410 midway starts again, a few times at
        most. A server that ignores ``limit`` answers in one body: its items are decoded one at a time
        (``listbodies``), each made into a record before the next, so their dicts never sit in memory together."""
        def ask(token: str | None) -> asyncio.Future[Any]:
            query = f"?limit={page}" + (f"&continue={quote(token, safe='')}" if token else "")
            return asyncio.ensure_future(self._call("GET", path + query, what, raw=True))

        for attempt in range(RESTARTS + 1):
            items: list[Any] = []
            version: str | None = None
            pending = ask(None)
            try:
                while True:
                    body = _list_body(await pending, what)
                    meta = body.head.get("metadata")  # None: written after the items (a custom resource's list)
                    if meta is not None and meta.get("continue"):
                        pending = ask(str(meta["continue"]))
                    found = _items(body, what)
                    items.extend(found if transform is None else map(transform, found))
                    if meta is None:
                        meta = body.head.get("metadata") or {}
                        if meta.get("continue"):
                            pending = ask(str(meta["continue"]))
                    del body, found
                    if version is None and meta.get("resourceVersion"):
                        version = str(meta["resourceVersion"])
                    if not meta.get("continue"):
                        return watching.Listing(items, version)
            except Expired:
                if attempt == RESTARTS:
                    raise
            finally:
                if not pending.done():
                    pending.cancel()
        raise AssertionError("unreachable")


def _not_a_list(what: str, e: ValueError) -> RetryLater:
    """A 200 whose body is not a list (a proxy's page, bytes mangled on the way): a failed read like any other.
    Only the decoding's errors are this: one a ``transform`` raises is the caller's own bug, not the server's."""
    return RetryLater(f"{what}: the server's answer is not a list: {e}", delay=1.0)


def _list_body(raw: bytes, what: str) -> listbodies.ListBody:
    try:
        return listbodies.ListBody(raw)
    except ValueError as e:
        raise _not_a_list(what, e) from e


def _items(body: listbodies.ListBody, what: str) -> Iterator[Any]:
    items = body.items()
    while True:
        try:
            item = next(items)
        except StopIteration:
            return
        except ValueError as e:
            raise _not_a_list(what, e) from e
        yield item
