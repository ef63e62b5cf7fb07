"""The HTTP face of the sandbox: a kmock handler that routes Kubernetes API requests to the store.

kmock gives the server (aiohttp on a loopback port), request parsing and its reaction DSL;
reactions added with that DSL (``sandbox.api[...] << ...``) still take precedence, so tests can
script odd answers. Everything else is routed here the way kube-apiserver routes it: discovery,
CRUD on collections and objects, ``status``, ``binding`` and ``scale`` subresources, server-side dry
run (``dryRun=All``: see ``store.DRY_RUN``), watches with resourceVersion resume, bookmarks, 410 Gone
and ``timeoutSeconds``, and Table output.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Mapping
from typing import Any

import aiohttp.web
import kmock
import yaml

from deviceshare.sandbox import (
    admission,
    catalog,
    deployments,
    discovery,
    errors,
    faults,
    identity,
    patches,
    protobuf,
    schema,
    selectors,
    store,
    tables,
)

_REQUEST_LOG_LIMIT = 2000
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


@dataclasses.dataclass(frozen=True)
class Target:
    group: str
    version: str
    plural: str | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


def parse_path(path: str) -> Target | None:
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    if (
        len(rest) >= 3
        and rest[0] == "namespaces"
        and not (len(rest) == 3 and rest[2] in ("status", "finalize"))
    ):
        namespace, rest = rest[1], rest[2:]
    if len(rest) > 3:
        return None
    padded = [*rest, None, None, None]
    return Target(group, version, padded[0], namespace, padded[1], padded[2])


def _json(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> aiohttp.web.Response:
    return aiohttp.web.Response(
        body=json.dumps(body).encode(), status=status, headers=headers, content_type="application/json"
    )


def _dry_run(params: Mapping[str, str], delete_options: Any) -> bool:
    """``dryRun=All`` from the query, or for a delete from its DeleteOptions body (where kubectl puts it)."""
    value = params.get("dryRun")
    if value is None and isinstance(delete_options, Mapping) and delete_options.get("dryRun"):
        value = ",".join(delete_options["dryRun"])
    if value is None:
        return False
    if value != "All":
        raise errors.bad_request(f'dryRun: Unsupported value: "{value}": supported values: "All"')
    return True


def _flag(params: Mapping[str, str], name: str) -> bool:
    return params.get(name, "").lower() in ("true", "1")


def _decode(request: kmock.Request) -> Any:
    if not request.body:
        return None
    content_type = request.headers.get("Content-Type", "")
    if "protobuf" in content_type:
        try:
            return protobuf.decode(request.body)
        except ValueError as e:
            raise errors.ApiError(
                415,
                "UnsupportedMediaType",
                f"{e}; send JSON instead (e.g. kubectl apply -f, or "
                "kubectl create ... --dry-run=client -o yaml | kubectl apply -f -)",
            ) from e
    if "cbor" in content_type:
        raise errors.ApiError(
            415,
            "UnsupportedMediaType",
            f"the body of the request was in an unknown format "
            f"- accepted media types include: application/json, application/yaml "
            f"(got {content_type})",
        )
    try:
        if "yaml" in content_type:
            return yaml.safe_load(request.body)
        return json.loads(request.body)
    except (ValueError, yaml.YAMLError) as e:
        raise errors.bad_request(f"the body of the request could not be decoded: {e}") from e


class ApiServer(kmock.KubernetesScaffold):
    """kmock's Kubernetes scaffold with the store behind it instead of canned answers."""

    def __init__(
        self,
        objects: store.ObjectStore,
        webhooks: admission.Admission,
        *,
        bookmark_interval: float = 5.0,
        users: Mapping[str, identity.User] | None = None,
    ) -> None:
        super().__init__()
        self.store = objects
        self.admission = webhooks
        self.users = dict(identity.DEFAULT_TOKENS if users is None else users)  # bearer token -> user
        self.faults = faults.Faults()
        self.bookmark_interval = bookmark_interval
        self.watches_gone = 0  # watches answered 410 Gone (for tests of client recovery)
        self.flowing = asyncio.Event()
        self.flowing.set()

    def __attrs_post_init__(self) -> None:
        pass  # no canned fallbacks: unmatched requests are served by the store

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        request = await self._parse(raw_request)
        self._requests.append(request)
        try:
            return await self._handle(request)
        except Exception as e:
            if self._errors:
                self._errors[-1].append(e)
            response: aiohttp.web.StreamResponse = await self._render_error(e)
            return response

    async def _parse(self, raw_request: aiohttp.web.BaseRequest) -> kmock.Request:
        if self._payloads:  # kmock's DSL filters on what its full parse extracts
            try:
                return await kmock.Request._parse(raw_request, id=len(self._requests))
            except ValueError:  # its path parser trips on e.g. /api/v1/namespaces; keep the HTTP facts
                pass
        # What the sandbox itself reads: a third of the full parse's cost, on every request.
        body = await raw_request.read()
        return kmock.Request(
            id=len(self._requests),
            raw_request=raw_request,
            url=raw_request.url,
            method=raw_request.method,
            params=dict(raw_request.query),
            headers=dict(raw_request.headers),
            body=body,
            text=body.decode(errors="replace"),
        )

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if len(self._requests) > _REQUEST_LOG_LIMIT:
            del self._requests[: _REQUEST_LOG_LIMIT // 2]
        if self._payloads:  # reactions scripted with kmock's DSL come first
            try:
                response: aiohttp.web.StreamResponse = await super()._handle(request)
                return response
            except NotImplementedError:
                pass
        try:
            fault = self.faults.take(str(request.method.value), request.url.path)
            if fault is not None:
                if fault.delay:
                    await asyncio.sleep(fault.delay)
                error = fault.error()
                if error is not None:
                    raise error
            return await self._serve(request)
        except errors.ApiError as e:
            return _json(e.status(), e.code, e.headers)

    async def _serve(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        path = request.url.path.rstrip("/") or "/"
        method = str(request.method.value).upper()
        static = self._static(path)
        if static is not None:
            if method != "GET":
                raise errors.method_not_allowed()
            return _json(static)
        target = parse_path(path)
        if target is None or target.plural is None:
            raise errors.endpoint_not_found()
        rtype = self.store.catalog.find(target.group, target.version, target.plural)
        if rtype is None or (target.namespace and not rtype.namespaced):
            raise errors.endpoint_not_found()
        if target.subresource and target.subresource not in rtype.subresources:
            raise errors.endpoint_not_found()
        params = request.params
        # Set for every request: a connection's next request (same task) must not inherit it.
        store.DRY_RUN.set(_dry_run(params, _decode(request) if method == "DELETE" else None))
        ns = target.namespace if rtype.namespaced else None
        if rtype.namespaced and ns is None and (target.name is not None or method != "GET"):
            raise errors.method_not_allowed()  # namespaced objects live under /namespaces/NS/ only
        if target.subresource == "scale" and target.name:
            content_type = request.headers.get("Content-Type", "")
            return _json(deployments.serve_scale(self.store, method, ns, target.name, content_type, _decode(request)))
        if method == "GET":
            if _flag(params, "watch"):
                return await self._watch(request, rtype, ns, target.name)
            if target.name is None:
                return self._list(request, rtype, ns)
            return self._answer(request, rtype, self.store.get(rtype, ns, target.name))
        if rtype.verbs == ("create",) and (method != "POST" or target.name is not None):
            raise errors.method_not_allowed()
        user = identity.from_authorization(request.headers.get("Authorization"), self.users)
        if method == "POST" and rtype.key == ("", "bindings") and ns:
            body = _decode(request) or {}
            await self.admission.validate(rtype, ns, "CREATE", body, user=user)
            return self._bound(ns, store.meta(body).get("name", ""), body)
        if method == "POST" and target.name is None:
            return await self._create(request, rtype, ns, user)
        if method == "POST" and target.subresource == "binding" and ns:
            body = _decode(request) or {}
            await self.admission.validate(rtype, ns, "CREATE", body, subresource="binding", user=user)
            return self._bound(ns, target.name or "", body)
        if method == "PUT" and target.name:
            body = _decode(request)
            if not isinstance(body, dict):
                raise errors.bad_request("the body of an update must be an object")
            self._strict(request, rtype, body)
            return _json(await self._update(rtype, ns, target, None, body, user))
        if method == "PATCH" and target.name:
            content_type = request.headers.get("Content-Type", patches.MERGE)
            if "json-patch" not in content_type:
                self._strict(request, rtype, _decode(request))
            return _json(await self._update(rtype, ns, target, content_type, _decode(request), user))
        if method == "DELETE" and target.name and not target.subresource:
            return _json(self.store.delete(rtype, ns, target.name, _decode(request)))
        if method == "DELETE" and target.name is None:
            items, rv = self._select(request, rtype, ns)
            gone = []
            for obj in items:  # an earlier deletion may have collected a later item already
                with contextlib.suppress(errors.ApiError):
                    gone.append(self.store.delete(rtype, ns, obj["metadata"]["name"], _decode(request)))
            return _json(
                {
                    "kind": f"{rtype.kind}List",
                    "apiVersion": rtype.api_version,
                    "metadata": {"resourceVersion": rv},
                    "items": gone,
                }
            )
        raise errors.method_not_allowed()

    async def _update(
        self,
        rtype: catalog.ResourceType,
        ns: str | None,
        target: Target,
        content_type: str | None,
        body: Any,
        user: identity.User,
    ) -> dict[str, Any]:
        """PUT or PATCH through validating admission: the result is checked, then stored if the object
        did not change while admission ran (else the write is redone on the new version, as the real
        API server retries a patch; a PUT with a stale resourceVersion then gets its 409)."""
        for _ in range(10):
            old, new = self.store.prepare_update(
                rtype, ns, target.name or "", content_type, body, target.subresource
            )
            await self.admission.validate(
                rtype, ns, "UPDATE", new, old, subresource=target.subresource or "", user=user
            )
            stored = self.store.commit_update(rtype, old, new)
            if stored is not None:
                return stored
        raise errors.conflict(rtype.plural, rtype.group, target.name or "", errors.STALE)

    @staticmethod
    def _strict(request: kmock.Request, rtype: catalog.ResourceType, body: Any) -> None:
        """``fieldValidation=Strict`` (kubectl's default): unknown fields are a 400, not pruned."""
        if request.params.get("fieldValidation") != "Strict" or rtype.schema is None:
            return
        unknown = schema.unknown_fields(rtype.schema, body)
        if unknown:
            fields = ", ".join(f'unknown field "{u}"' for u in unknown)
            raise errors.bad_request(
                f'{rtype.kind} in version "{rtype.version}" cannot be handled as a {rtype.kind}: '
                f"strict decoding error: {fields}"
            )

    def _bound(self, namespace: str, name: str, binding: Mapping[str, Any]) -> aiohttp.web.Response:
        self.store.bind(namespace, name, binding)
        return _json(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201
        )

    def _static(self, path: str) -> dict[str, Any] | None:
        types = self.store.catalog
        if path == "/":
            return discovery.root_paths(types)
        if path == "/version":
            return discovery.VERSION
        if path == "/api":
            return discovery.core_versions()
        if path == "/apis":
            return discovery.group_list(types)
        parts = path.strip("/").split("/")
        if parts[0] in ("healthz", "livez", "readyz"):
            return {"status": "ok"}
        found: dict[str, Any] | None = None
        if parts[0] == "openapi":
            if parts == ["openapi", "v3"]:
                return discovery.openapi_v3_root(types)
            if parts[:2] == ["openapi", "v3"] and len(parts) in (4, 5):
                group_name, version = ("", parts[3]) if parts[2] == "api" else (parts[3], parts[-1])
                found = discovery.openapi_v3_group_version(types, group_name, version)
            if found is None:
                raise errors.endpoint_not_found()
            return found
        if parts == ["api", "v1"]:
            found = discovery.resource_list(types, "", "v1")
        elif len(parts) == 2 and parts[0] == "apis":
            found = discovery.group(types, parts[1])
            if found is None:
                raise errors.endpoint_not_found()
        elif len(parts) == 3 and parts[0] == "apis":
            found = discovery.resource_list(types, parts[1], parts[2])
            if found is None:
                raise errors.endpoint_not_found()
        return found

    def _select(
        self, request: kmock.Request, rtype: catalog.ResourceType, ns: str | None, *, copied: bool = True
    ) -> tuple[list[dict[str, Any]], str]:
        labels = selectors.parse_labels(request.params.get("labelSelector"))
        fields = selectors.parse_fields(request.params.get("fieldSelector"), rtype.selectable)
        return self.store.list_objects(rtype, ns, labels, fields, copied=copied)

    def _list(
        self, request: kmock.Request, rtype: catalog.ResourceType, ns: str | None
    ) -> aiohttp.web.Response:
        if "as=Table" not in request.headers.get("Accept", ""):
            labels = selectors.parse_labels(request.params.get("labelSelector"))
            fields = selectors.parse_fields(request.params.get("fieldSelector"), rtype.selectable)
            encoded, rv = self.store.list_encoded(rtype, ns, labels, fields)
            head = json.dumps(
                {
                    "kind": f"{rtype.kind}List",
                    "apiVersion": rtype.api_version,
                    "metadata": {"resourceVersion": rv},
                }
            )
            body = head[:-1].encode() + b', "items": [' + b", ".join(encoded) + b"]}"
            return aiohttp.web.Response(body=body, content_type="application/json")
        items, rv = self._select(request, rtype, ns, copied=False)  # serialized right away
        if "as=Table" in request.headers.get("Accept", ""):
            return _json(tables.table(rtype, items, rv, request.params.get("includeObject", "Metadata")))
        return _json(
            {
                "kind": f"{rtype.kind}List",
                "apiVersion": rtype.api_version,
                "metadata": {"resourceVersion": rv},
                "items": items,
            }
        )

    def _answer(
        self, request: kmock.Request, rtype: catalog.ResourceType, obj: dict[str, Any], status: int = 200
    ) -> aiohttp.web.Response:
        if "as=Table" in request.headers.get("Accept", ""):
            found = tables.table(
                rtype, [obj], self.store.resource_version, request.params.get("includeObject", "Metadata")
            )
            return _json(found, status)
        return _json(obj, status)

    async def _create(
        self, request: kmock.Request, rtype: catalog.ResourceType, ns: str | None, user: identity.User
    ) -> aiohttp.web.Response:
        body = _decode(request)
        if not isinstance(body, dict):
            raise errors.bad_request("the body of a create must be an object")
        self._strict(request, rtype, body)
        md = body.setdefault("metadata", {})
        if rtype.namespaced and ns and not md.get("namespace"):
            md["namespace"] = ns
        body = await self.admission.admit_create(rtype, ns, body, user)
        await self.admission.validate(rtype, ns, "CREATE", body, user=user)
        return self._answer(request, rtype, self.store.create(rtype, ns, body), 201)

    async def _watch(
        self, request: kmock.Request, rtype: catalog.ResourceType, ns: str | None, name: str | None
    ) -> aiohttp.web.StreamResponse:
        params = request.params
        labels = selectors.parse_labels(params.get("labelSelector"))
        fields = selectors.parse_fields(params.get("fieldSelector"), rtype.selectable)
        bookmarks = _flag(params, "allowWatchBookmarks")
        rv = params.get("resourceVersion") or ""
        initial = _flag(params, "sendInitialEvents") or rv in ("", "0")
        lifetime = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        if not initial and not rv.isdigit():
            raise errors.bad_request(f"invalid resource version: {rv!r}")

        def visible(obj: Mapping[str, Any] | None) -> bool:
            if obj is None:
                return False
            md = store.meta(obj)
            return (
                (ns is None or md.get("namespace") == ns)
                and (name is None or md.get("name") == name)
                and labels.matches(md.get("labels"))
                and fields.matches(obj)
            )

        as_table = "as=Table" in request.headers.get("Accept", "")
        include = params.get("includeObject", "Metadata")

        def encode(kind: str, obj: Mapping[str, Any], event: store.WatchEvent | None = None) -> bytes:
            if as_table:  # kubectl get -w: each event carries a one-row Table
                obj = tables.table(rtype, [obj], store.meta(obj).get("resourceVersion", ""), include)
            elif event is not None and kind == event.type:
                return event.line
            return json.dumps({"type": kind, "object": obj}).encode() + b"\n"

        raw = request._raw_request
        assert raw is not None  # always set for requests that came over HTTP
        response = aiohttp.web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(raw)
        try:
            sub, backlog = self.store.subscribe(rtype.key, None if initial else int(rv))
        except errors.ApiError as e:
            self.watches_gone += 1
            await response.write(json.dumps({"type": "ERROR", "object": e.status()}).encode() + b"\n")
            await response.write_eof()
            return response
        try:
            if initial:
                items, list_rv = self.store.list_objects(rtype, ns, labels, fields)
                lines = [encode("ADDED", obj) for obj in items if visible(obj)]
                if bookmarks and _flag(params, "sendInitialEvents"):
                    lines.append(self._bookmark(rtype, list_rv, initial_end=True))
                if lines:
                    await response.write(b"".join(lines))
            for event in backlog:
                await self._send(response, event, visible, encode)
            await self._stream(response, raw, sub, rtype, visible, encode, bookmarks, lifetime)
        except ConnectionResetError:
            return response  # the client went away
        finally:
            self.store.unsubscribe(sub)
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await response.write_eof()
        return response

    async def _stream(
        self,
        response: aiohttp.web.StreamResponse,
        raw: Any,
        sub: store.Subscription,
        rtype: catalog.ResourceType,
        visible: Any,
        encode: Any,
        bookmarks: bool,
        lifetime: float | None,
    ) -> None:
        deadline = None if lifetime is None else time.monotonic() + lifetime
        while True:
            wait = self.bookmark_interval
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    if bookmarks:
                        await response.write(self._bookmark(rtype, self.store.resource_version))
                    return
            try:
                event = await asyncio.wait_for(sub.queue.get(), wait)
            except TimeoutError:
                if raw.transport is None or raw.transport.is_closing():
                    return
                if bookmarks and sub.queue.empty():
                    await response.write(self._bookmark(rtype, self.store.resource_version))
                continue
            if event is None:
                return
            # Everything already queued goes out in one write: one event per loop turn falls far behind
            # a busy server (each turn runs every ready request handler first).
            batch: list[store.WatchEvent | None] = [event]
            while not sub.queue.empty():
                batch.append(sub.queue.get_nowait())
            await self.flowing.wait()  # stalled watches hold their events until resumed
            if sub.closed:
                return
            ended = None in batch
            chunks = [self._render(e, visible, encode) for e in batch if e is not None]
            data = b"".join(c for c in chunks if c)
            if data:
                await response.write(data)
            if ended:
                return

    @classmethod
    async def _send(
        cls, response: aiohttp.web.StreamResponse, event: store.WatchEvent, visible: Any, encode: Any
    ) -> None:
        data = cls._render(event, visible, encode)
        if data:
            await response.write(data)

    @staticmethod
    def _render(event: store.WatchEvent, visible: Any, encode: Any) -> bytes | None:
        """One event as this watcher sees it: objects moving in or out of its selector are ADDED/DELETED."""
        now_ok, before_ok = visible(event.obj), visible(event.old)
        if event.type == "MODIFIED" and now_ok and not before_ok:
            kind = "ADDED"
        elif event.type == "MODIFIED" and before_ok and not now_ok:
            kind = "DELETED"
        elif now_ok:
            kind = event.type
        else:
            return None
        data: bytes = encode(kind, event.obj, event)
        return data

    @staticmethod
    def _bookmark(rtype: catalog.ResourceType, rv: str, initial_end: bool = False) -> bytes:
        md: dict[str, Any] = {"resourceVersion": rv}
        if initial_end:
            md["annotations"] = {INITIAL_EVENTS_END: "true"}
        obj = {"kind": rtype.kind, "apiVersion": rtype.api_version, "metadata": md}
        return json.dumps({"type": "BOOKMARK", "object": obj}).encode() + b"\n"
