"""A minimal Kubernetes API for the webhook's caches: list (paged) and watch of three collections.

Only what the group cache uses: ``GET /api/v1/pods`` (with an ``exists`` label selector),
``GET /api/v1/resourcequotas`` and ``GET /apis/deviceshare.io/v1alpha1/shareddevicegroups``, each
with ``limit``/``continue``, ``watch``, ``resourceVersion`` and ``timeoutSeconds``, and ``GET`` of one
group. Tests drive it directly: put and delete objects, compact history (so old resourceVersions get
410 Gone), end every open watch, hold watch events back and release them, make the next requests
fail, slow the lists down, hold a group GET until released, or have it answer an older state (a
lagging read). :attr:`FakeApi.log` records, in order, each watch event sent and each GET answered.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from deviceshare.api import names
from tests import waiting

PODS = "pods"
GROUPS = names.PLURAL
QUOTAS = "resourcequotas"
GROUP_GET = "get shareddevicegroup"
_PATHS = {
    PODS: "/api/v1/pods",
    GROUPS: f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL}",
    QUOTAS: "/api/v1/resourcequotas",
}


class FakeApi:
    def __init__(self) -> None:
        self.rv = 100
        self.objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {PODS: {}, GROUPS: {}, QUOTAS: {}}
        self.history: list[tuple[int, str, str, dict[str, Any]]] = []  # rv, collection, type, object
        self.oldest_rv = 0  # watches from before this version get 410
        self.watchers: list[tuple[str, asyncio.Queue[tuple[str, dict[str, Any]] | None]]] = []
        self.fail_next = 0  # answer that many requests with 500
        self.lists_flowing = asyncio.Event()  # cleared: list requests wait until it is set (a slow API server)
        self.lists_flowing.set()
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.held: list[tuple[str, str, dict[str, Any]]] | None = None  # watch events not sent yet
        self.stale_gets: dict[tuple[str, str], dict[str, Any]] = {}  # what a group GET answers instead
        self.get_read = asyncio.Event()  # a group GET has read its answer
        self.get_gate: asyncio.Event | None = None  # when set here, a group GET answers once it is set
        self.log: list[tuple[str, str, int]] = []  # groups: ("watch", event type, rv), ("get", name, rv)
        self.url = ""
        self._runner: web.AppRunner | None = None

    # -- test controls ----------------------------------------------------------------------

    def put(self, collection: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        key = (meta.get("namespace", ""), meta["name"])
        event = "MODIFIED" if key in self.objects[collection] else "ADDED"
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        self.objects[collection][key] = obj
        self._emit(collection, event, obj)
        return obj

    def delete(self, collection: str, namespace: str, name: str) -> None:
        obj = self.objects[collection].pop((namespace, name))
        self.rv += 1
        obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.rv)}}
        self._emit(collection, "DELETED", obj)

    def compact(self) -> None:
        """Forget history: resuming from any version seen so far now gets 410 Gone."""
        self.oldest_rv = self.rv + 1
        self.history.clear()

    def end_watches(self) -> None:
        """Close every open watch, as the server does when timeoutSeconds passes."""
        for _, queue in self.watchers:
            queue.put_nowait(None)

    def hold_watches(self) -> None:
        """Keep watch events from being sent (a watch that lags) until :meth:`release_watches`."""
        self.held = []

    def release_watches(self) -> None:
        held, self.held = self.held or [], None
        for collection, event, obj in held:
            self._send(collection, event, obj)

    def group_gets(self) -> int:
        return sum(1 for c, _ in self.requests if c == GROUP_GET)

    def watch_count(self, collection: str) -> int:
        return sum(1 for c, _ in self.watchers if c == collection)

    def _emit(self, collection: str, event: str, obj: dict[str, Any]) -> None:
        self.history.append((self.rv, collection, event, obj))
        if self.held is not None:
            self.held.append((collection, event, obj))
        else:
            self._send(collection, event, obj)

    def _send(self, collection: str, event: str, obj: dict[str, Any]) -> None:
        for c, queue in self.watchers:
            if c == collection and self._selected(collection, obj, queue):
                queue.put_nowait((event, obj))

    def _selected(self, collection: str, obj: dict[str, Any], _: object = None) -> bool:
        return collection != PODS or names.POD_GROUP_LABEL in (obj["metadata"].get("labels") or {})

    # -- server -----------------------------------------------------------------------------

    async def start(self) -> str:
        app = web.Application()
        for collection, path in _PATHS.items():
            app.router.add_get(path, self._handler(collection))
        app.router.add_get(f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{{ns}}/{names.PLURAL}/{{name}}", self._get)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        self.lists_flowing.set()
        self.end_watches()
        if self._runner is not None:
            await self._runner.cleanup()

    def _handler(self, collection: str) -> Any:
        async def handle(request: web.Request) -> web.StreamResponse:
            query = dict(request.query)
            self.requests.append((collection, query))
            if collection == PODS and query.get("labelSelector") not in (None, names.POD_GROUP_LABEL):
                return web.json_response({"message": "only the group-label selector is faked"}, status=400)
            if self.fail_next > 0:
                self.fail_next -= 1
                return web.json_response({"kind": "Status", "code": 500, "message": "boom"}, status=500)
            if query.get("watch") in ("true", "True", "1"):
                return await self._watch(request, collection, query)
            await self.lists_flowing.wait()
            return self._list(collection, query)

        return handle

    async def _get(self, request: web.Request) -> web.Response:
        key = (request.match_info["ns"], request.match_info["name"])
        self.requests.append((GROUP_GET, {"namespace": key[0], "name": key[1]}))
        obj = copy.deepcopy(self.stale_gets.get(key) or self.objects[GROUPS].get(key))
        self.get_read.set()
        if self.get_gate is not None:
            await self.get_gate.wait()
        if obj is None:
            status = {"kind": "Status", "code": 404, "reason": "NotFound", "message": f"{key[1]} not found"}
            return web.json_response(status, status=404)
        self.log.append(("get", key[1], int(obj["metadata"]["resourceVersion"])))
        return web.json_response(obj)

    def _list(self, collection: str, query: dict[str, str]) -> web.Response:
        items = [o for o in self.objects[collection].values() if self._selected(collection, o)]
        start = int(query.get("continue") or 0)
        limit = int(query.get("limit") or 0) or len(items) or 1
        page = items[start : start + limit]
        meta: dict[str, Any] = {"resourceVersion": str(self.rv)}
        if start + limit < len(items):
            meta["continue"] = str(start + limit)
        return web.json_response({"kind": "List", "metadata": meta, "items": page})

    async def _watch(
        self, request: web.Request, collection: str, query: dict[str, str]
    ) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.content_type = "application/json"
        await resp.prepare(request)
        since = int(query.get("resourceVersion") or self.rv)
        if since < self.oldest_rv - 1:
            status = {"kind": "Status", "code": 410, "reason": "Expired", "message": f"too old: {since}"}
            await resp.write(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
            return resp
        queue: asyncio.Queue[tuple[str, dict[str, Any]] | None] = asyncio.Queue()
        for rv, c, event, obj in self.history:
            if c == collection and rv > since and self._selected(collection, obj):
                queue.put_nowait((event, obj))
        entry = (collection, queue)
        self.watchers.append(entry)
        try:
            while (item := await queue.get()) is not None:
                await resp.write(json.dumps({"type": item[0], "object": item[1]}).encode() + b"\n")
                if collection == GROUPS:
                    self.log.append(("watch", item[0], int(item[1]["metadata"]["resourceVersion"])))
        finally:
            self.watchers.remove(entry)
        return resp


async def until(condition: Callable[[], bool], timeout_s: float = waiting.HANG_GUARD) -> None:
    """Wait for state that a watch or a reload changes in the background (no event to wait on)."""
    await waiting.until(condition, "a state changed in the background", timeout=timeout_s, interval=0.005)


def group(namespace: str, name: str, resources: dict[str, int] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"resources": resources or {"nvidia.com/gpu": 1}, **spec},
    }


def member(namespace: str, name: str, group_name: str, phase: str = "Pending", **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": namespace,
            "name": name,
            "labels": {names.POD_GROUP_LABEL: group_name},
            **meta,
        },
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        "status": {"phase": phase},
    }
