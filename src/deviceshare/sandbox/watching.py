"""Watch streams as kube-apiserver serves them: initial events, resume, bookmarks, 410 Gone, timeouts.

Apart from the request routing in ``apiserver`` because a watch is a long-lived stream with its own
life: it lists (or resumes from a resourceVersion out of the store's watch history), then sends
every change its selectors see, an object moving in or out of them as ADDED or DELETED, in batches,
with bookmarks when idle and when ``timeoutSeconds`` ends it. A compacted version gets an ERROR
event with 410 Gone, as a real server answers a watch (clients then re-list).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Mapping
from typing import Any, Protocol

import aiohttp.web
import kmock
import orjson

from deviceshare.sandbox import catalog, errors, parsing, selectors, store, tables

INITIAL_EVENTS_END = "k8s.io/initial-events-end"


class Server(Protocol):
    """What a watch needs of the API server serving it (tests tune and read these on ``ApiServer``)."""

    store: store.ObjectStore
    bookmark_interval: float  # seconds of quiet before a bookmark
    watches_gone: int  # watches answered 410 Gone (for tests of client recovery)
    flowing: asyncio.Event  # cleared: open watches hold their events (a stuck API server)


@dataclasses.dataclass(frozen=True)
class _View:
    """What one watcher sees: its namespace, name and selectors, and the form its events take."""

    rtype: catalog.ResourceType
    namespace: str | None
    name: str | None
    labels: selectors.LabelSelector
    fields: selectors.FieldSelector
    as_table: bool
    include: str

    def visible(self, obj: Mapping[str, Any] | None) -> bool:
        if obj is None:
            return False
        md = store.meta(obj)
        return (
            (self.namespace is None or md.get("namespace") == self.namespace)
            and (self.name is None or md.get("name") == self.name)
            and self.labels.matches(md.get("labels"))
            and self.fields.matches(obj)
        )

    def encode(self, kind: str, obj: Mapping[str, Any], event: store.WatchEvent | None = None) -> bytes:
        if self.as_table:  # kubectl get -w: each event carries a one-row Table
            obj = tables.table(self.rtype, [obj], store.meta(obj).get("resourceVersion", ""), self.include)
        elif event is not None and kind == event.type:
            return event.line
        return orjson.dumps({"type": kind, "object": obj}) + b"\n"

    def render(self, event: store.WatchEvent) -> bytes | None:
        """One event as this watcher sees it: objects moving in or out of its selector are ADDED/DELETED."""
        now_ok, before_ok = self.visible(event.obj), self.visible(event.old)
        if event.type == "MODIFIED" and now_ok and not before_ok:
            kind = "ADDED"
        elif event.type == "MODIFIED" and before_ok and not now_ok:
            kind = "DELETED"
        elif now_ok:
            kind = event.type
        else:
            return None
        return self.encode(kind, event.obj, event)


async def serve(
    server: Server, request: kmock.Request, rtype: catalog.ResourceType, ns: str | None, name: str | None
) -> aiohttp.web.StreamResponse:
    params = request.params
    labels, fields = parsing.selectors_of(params, rtype)
    bookmarks = parsing.flag(params, "allowWatchBookmarks")
    rv = params.get("resourceVersion") or ""
    initial = parsing.flag(params, "sendInitialEvents") or rv in ("", "0")
    lifetime = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
    if not initial and not rv.isdigit():
        raise errors.bad_request(f"invalid resource version: {rv!r}")
    include = params.get("includeObject", "Metadata")
    view = _View(rtype, ns, name, labels, fields, parsing.wants_table(request), include)

    raw = request._raw_request
    assert raw is not None  # always set for requests that came over HTTP
    response = aiohttp.web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    await response.prepare(raw)
    try:
        sub, backlog = server.store.subscribe(rtype.key, None if initial else int(rv))
    except errors.ApiError as e:
        server.watches_gone += 1
        await response.write(json.dumps({"type": "ERROR", "object": e.status()}).encode() + b"\n")
        await response.write_eof()
        return response
    try:
        if initial:
            items, list_rv = server.store.list_objects(rtype, ns, labels, fields)
            lines = [view.encode("ADDED", obj) for obj in items if view.visible(obj)]
            if bookmarks and parsing.flag(params, "sendInitialEvents"):
                lines.append(_bookmark(rtype, list_rv, initial_end=True))
            if lines:
                await response.write(b"".join(lines))
        for event in backlog:
            data = view.render(event)
            if data:
                await response.write(data)
        await _stream(server, response, raw, sub, view, bookmarks, lifetime)
    except ConnectionResetError:
        return response  # the client went away
    finally:
        server.store.unsubscribe(sub)
    with contextlib.suppress(ConnectionResetError, RuntimeError):
        await response.write_eof()
    return response


async def _stream(
    server: Server,
    response: aiohttp.web.StreamResponse,
    raw: Any,
    sub: store.Subscription,
    view: _View,
    bookmarks: bool,
    lifetime: float | None,
) -> None:
    deadline = None if lifetime is None else time.monotonic() + lifetime
    while True:
        wait = server.bookmark_interval
        if deadline is not None:
            wait = min(wait, deadline - time.monotonic())
            if wait <= 0:
                if bookmarks:
                    await response.write(_bookmark(view.rtype, server.store.resource_version))
                return
        try:
            event = await asyncio.wait_for(sub.queue.get(), wait)
        except TimeoutError:
            if raw.transport is None or raw.transport.is_closing():
                return
            if bookmarks and sub.queue.empty():
                await response.write(_bookmark(view.rtype, server.store.resource_version))
            continue
        if event is None:
            return
        # Everything already queued goes out in one write: one event per loop turn falls far behind
        # a busy server (each turn runs every ready request handler first).
        batch: list[store.WatchEvent | None] = [event]
        while not sub.queue.empty():
            batch.append(sub.queue.get_nowait())
        await server.flowing.wait()  # stalled watches hold their events until resumed
        if sub.closed:
            return
        ended = None in batch
        chunks = [view.render(e) for e in batch if e is not None]
        data = b"".join(c for c in chunks if c)
        if data:
            await response.write(data)
        if ended:
            return


def _bookmark(rtype: catalog.ResourceType, rv: str, initial_end: bool = False) -> bytes:
    md: dict[str, Any] = {"resourceVersion": rv}
    if initial_end:
        md["annotations"] = {INITIAL_EVENTS_END: "true"}
    obj = {"kind": rtype.kind, "apiVersion": rtype.api_version, "metadata": md}
    return json.dumps({"type": "BOOKMARK", "object": obj}).encode() + b"\n"
