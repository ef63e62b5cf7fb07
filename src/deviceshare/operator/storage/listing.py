"""Whole collections read page by page (``limit`` / ``continue``), each page turned into records as it arrives.

A rebuild at Kubernetes' envelope lists 150,000 pods: read at once, their JSON (230 MiB) and the dicts parsed from
it (several times that) sat in memory together before the first record was made, and the operator's RSS never came
back down (1.4 GiB measured, see docs/benchmarks.md). Page by page, only one page of dicts lives at a time: each is
handed to ``transform`` (``state.pod_record``, ``state.group_record``...) and dropped. The list's resourceVersion
is the one its pages are read at (kube-apiserver serves every page at the first page's), so a watch resumed from
it misses nothing. A continue token that expires midway (410) starts the list again, a few times at most.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, overload
from urllib.parse import quote

from deviceshare.api import names
from deviceshare.kube import watching

from .errors import Expired

PAGE = 2000  # objects per page: ~3 MiB of pods, a handful of milliseconds to decode
RESTARTS = 3


T = TypeVar("T")
Body = dict[str, Any]


class Reads(Protocol):
    async def _call(self, method: str, path: str, what: str) -> Any: ...


class Collections:
    """Every node, pod and group, page by page; with ``transform``, each made into what it returns as its page
    arrives (``state.pod_record``, ``inventory.node_from_object``...), the bodies dropped page by page."""

    @overload
    async def list_nodes(self) -> watching.Listing[Body]: ...
    @overload
    async def list_nodes(self, transform: Callable[[Body], T]) -> watching.Listing[T]: ...
    async def list_nodes(self, transform: Callable[[Body], Any] | None = None) -> watching.Listing[Any]:
        return await collection(self, "/api/v1/nodes", "list nodes", transform)  # type: ignore[arg-type]

    @overload
    async def list_pods(self) -> watching.Listing[Body]: ...
    @overload
    async def list_pods(self, transform: Callable[[Body], T]) -> watching.Listing[T]: ...
    async def list_pods(self, transform: Callable[[Body], Any] | None = None) -> watching.Listing[Any]:
        return await collection(self, "/api/v1/pods", "list pods", transform)  # type: ignore[arg-type]

    @overload
    async def list_groups(self) -> watching.Listing[Body]: ...
    @overload
    async def list_groups(self, transform: Callable[[Body], T]) -> watching.Listing[T]: ...
    async def list_groups(self, transform: Callable[[Body], Any] | None = None) -> watching.Listing[Any]:
        path = f"/apis/{names.API_VERSION}/{names.PLURAL}"
        return await collection(self, path, "list shareddevicegroups", transform)  # type: ignore[arg-type]


async def collection(
    api: Reads, path: str, what: str, transform: Callable[[Body], Any] | None = None, *, page: int = PAGE
) -> watching.Listing[Any]:
    """Every object at ``path`` (a collection), each passed through ``transform`` (``None``: kept as it is)."""
    for attempt in range(RESTARTS + 1):
        try:
            return await _pages(api, path, what, transform, page)
        except Expired:
            if attempt == RESTARTS:
                raise
    raise AssertionError("unreachable")


async def _pages(
    api: Reads, path: str, what: str, transform: Callable[[Body], Any] | None, page: int
) -> watching.Listing[Any]:
    """The pages in order; the next one is asked for as soon as a page arrives, so the server (another process)
    prepares and sends it while this one makes records of the last."""
    items: list[Any] = []
    version: str | None = None

    def ask(token: str | None) -> asyncio.Task[Any]:
        query = f"?limit={page}" + (f"&continue={quote(token, safe='')}" if token else "")
        return asyncio.ensure_future(api._call("GET", path + query, what))

    pending = ask(None)
    try:
        while True:
            data = await pending
            meta = data.get("metadata") or {}
            token = meta.get("continue") or None
            if token:
                pending = ask(token)
            if version is None and meta.get("resourceVersion"):
                version = str(meta["resourceVersion"])
            found = data.get("items") or []
            items.extend(found if transform is None else map(transform, found))
            del data, found
            if not token:
                return watching.Listing(items, version)
    finally:
        if not pending.done():
            pending.cancel()
