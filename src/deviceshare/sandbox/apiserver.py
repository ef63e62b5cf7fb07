"""The HTTP face of the sandbox: a kmock handler that routes Kubernetes API requests to the store.

kmock gives the server (aiohttp on a loopback port), request parsing and its reaction DSL;
reactions added with that DSL (``sandbox.api[...] << ...``) still take precedence, so tests can
script odd answers. Everything else is routed here the way kube-apiserver routes it: discovery
documents (``discovery``), CRUD on collections and objects through admission, ``status``,
``binding``, ``scale`` and ``eviction`` subresources, server-side dry run (``dryRun=All``: see ``dryrun``),
server-side apply (``applying``; every write's owner recorded by ``managedfields``), and Table output.
Reading a request is in ``parsing``; watch streams, with resourceVersion resume, bookmarks, 410 Gone
and ``timeoutSeconds``, are in ``watching``; how a request an injected fault matched is answered, in ``faultserving``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Mapping
from typing import Any

import aiohttp.web
import kmock
import orjson

from deviceshare.sandbox import (
    admission,
    applying,
    catalog,
    deployments,
    discovery,
    errors,
    eviction,
    faults,
    faultserving,
    identity,
    managedfields,
    paging,
    parsing,
    patches,
    registry,
    store,
    tables,
    watching,
)

_REQUEST_LOG_LIMIT = 2000


def _json(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> aiohttp.web.Response:
    return aiohttp.web.Response(
        body=orjson.dumps(body), status=status, headers=headers, content_type="application/json"
    )


def _limit(raw: str | None) -> int | None:
    """``limit``: a positive integer asks for pages; anything else (absent, 0) for the whole list."""
    try:
        value = int(raw) if raw else 0
    except ValueError:
        raise errors.bad_request(f"limit: invalid value {raw!r}") from None
    return value if value > 0 else None


def _list_head(rtype: catalog.ResourceType, rv: str) -> dict[str, Any]:
    """A list's body without its items: kind ``<Kind>List`` at the list's resourceVersion."""
    return {"kind": f"{rtype.kind}List", "apiVersion": rtype.api_version, "metadata": {"resourceVersion": rv}}


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
        self.pages = paging.Pages()  # lists asked for with ``limit`` / ``continue``
        # Every list answered whole, ``limit`` ignored: as kube-apiserver's watch cache served a list at
        # resourceVersion=0 for years (the API concepts page, "Semantics for get and list": with the watch cache
        # on, such a list "may" ignore limit; the cacher delegated only lists with a limit *and* another
        # resourceVersion to etcd, which pages). A client must cope with one huge body.
        self.whole_lists = False
        # LIST requests served, by plural: ``lists`` counts the lists begun (a first page, or a whole list),
        # ``pages`` every page of them (tests count a restart's reads of the cluster with these).
        self.lists: collections.Counter[str] = collections.Counter()
        self.pages_served: collections.Counter[str] = collections.Counter()
        self.users = dict(identity.DEFAULT_TOKENS if users is None else users)  # bearer token -> user
        self.faults = faults.Faults()
        self._faulted = faultserving.FaultedRequests(_json)  # requests a fault matched (faultserving.py)
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
        except faults.Dropped:  # the connection is closed: whatever is answered here never arrives
            return aiohttp.web.Response(status=500)
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
            method = str(request.method.value)
            fault = self.faults.take(method, request.url.path)
            if fault is None:
                return await self._serve(request)
            return await self._faulted.serve(fault, request, self._serve)
        except errors.ApiError as e:
            return _json(e.status(), e.code, e.headers)

    async def _serve(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        path = request.url.path.rstrip("/") or "/"
        method = str(request.method.value).upper()
        static = discovery.document(self.store.catalog, path)
        if static is not None:
            if method != "GET":
                raise errors.method_not_allowed()
            return _json(static)
        target = parsing.parse_path(path)
        if target is None or target.plural is None:
            raise errors.endpoint_not_found()
        rtype = self.store.catalog.find(target.group, target.version, target.plural)
        if rtype is None or (target.namespace and not rtype.namespaced):
            raise errors.endpoint_not_found()
        if target.subresource and target.subresource not in rtype.subresources:
            raise errors.endpoint_not_found()
        params = request.params
        parsing.check_custom_body(request, rtype)
        manager = managedfields.manager_of(params, request.headers.get("User-Agent"))  # who writes, for managedFields
        # Set for every request: a connection's next request (same task) must not inherit it.
        store.DRY_RUN.set(parsing.dry_run(params, parsing.decode(request) if method == "DELETE" else None))
        ns = target.namespace if rtype.namespaced else None
        if rtype.namespaced and ns is None and (target.name is not None or method != "GET"):
            raise errors.method_not_allowed()  # namespaced objects live under /namespaces/NS/ only
        if target.subresource == "scale" and target.name:
            content_type, body = request.headers.get("Content-Type", ""), parsing.decode(request)
            return _json(deployments.serve_scale(self.store, method, ns, target.name, content_type, body, manager))
        if method == "GET":
            if parsing.flag(params, "watch"):
                return await watching.serve(self, request, rtype, ns, target.name)
            if target.name is None:
                return self._list(request, rtype, ns)
            return self._answer(request, rtype, self.store.get(rtype, ns, target.name))
        if rtype.verbs == ("create",) and (method != "POST" or target.name is not None):
            raise errors.method_not_allowed()
        user = identity.from_authorization(request.headers.get("Authorization"), self.users)
        if method == "POST" and rtype.key == ("", "bindings") and ns:
            body = parsing.decode(request) or {}
            await self.admission.validate(rtype, ns, "CREATE", body, user=user)
            return self._bound(ns, store.meta(body).get("name", ""), body)
        if method == "POST" and target.name is None:
            return await self._create(request, rtype, ns, user, manager)
        if method == "POST" and target.subresource == "binding" and ns:
            body = parsing.decode(request) or {}
            await self.admission.validate(rtype, ns, "CREATE", body, subresource="binding", user=user)
            return self._bound(ns, target.name or "", body)
        if method == "POST" and target.subresource == "eviction" and ns:
            body = parsing.decode(request)
            await self.admission.validate(rtype, ns, "CREATE", body, subresource="eviction", user=user)
            return _json(eviction.evict(self.store, ns, target.name or "", body, eviction.dry_run(body)), 201)
        if method == "PUT" and target.name:
            body = parsing.decode(request)
            if not isinstance(body, dict):
                raise errors.bad_request("the body of an update must be an object")
            parsing.check_strict(request, rtype, body)
            return _json(await self._update(rtype, ns, target, None, body, user, manager))
        if method == "PATCH" and target.name:
            content_type = request.headers.get("Content-Type", patches.MERGE)
            is_apply = content_type.split(";")[0].strip() == patches.APPLY
            opts = applying.options(params, apply=is_apply)
            if "json-patch" not in content_type:
                parsing.check_strict(request, rtype, parsing.decode(request))
            if is_apply:  # server-side apply: see applying
                obj, code = await applying.apply(
                    self.store, self.admission, rtype, ns, target.name, target.subresource,
                    parsing.decode(request), opts, user,
                )
                return _json(obj, code)
            return _json(await self._update(rtype, ns, target, content_type, parsing.decode(request), user, manager))
        if method == "DELETE" and target.name and not target.subresource:
            return _json(self.store.delete(rtype, ns, target.name, parsing.decode(request)))
        if method == "DELETE" and target.name is None:
            items, rv = self._select(request, rtype, ns)
            gone = []
            for obj in items:  # an earlier deletion may have collected a later item already
                with contextlib.suppress(errors.ApiError):
                    gone.append(self.store.delete(rtype, ns, obj["metadata"]["name"], parsing.decode(request)))
            return _json({**_list_head(rtype, rv), "items": gone})
        raise errors.method_not_allowed()

    async def _update(
        self,
        rtype: catalog.ResourceType,
        ns: str | None,
        target: parsing.Target,
        content_type: str | None,
        body: Any,
        user: identity.User,
        manager: str,
    ) -> dict[str, Any]:
        """PUT or PATCH through validating admission: the result is checked, then stored if the object
        did not change while admission ran (else the write is redone on the new version, as the real
        API server retries a patch; a PUT with a stale resourceVersion then gets its 409)."""
        for _ in range(10):
            old, new = self.store.prepare_update(
                rtype, ns, target.name or "", content_type, body, target.subresource
            )
            managedfields.track_update(applying.shape_of(rtype), old, new, manager, rtype.api_version,
                                       has_status=rtype.has_status, subresource=target.subresource)
            registry.check_update(rtype, old, new)  # the schema answers before validating admission
            await self.admission.validate(
                rtype, ns, "UPDATE", new, old, subresource=target.subresource or "", user=user
            )
            stored = self.store.commit_update(rtype, old, new)
            if stored is not None:
                return stored
        raise errors.conflict(rtype.plural, rtype.group, target.name or "", errors.STALE)

    def _bound(self, namespace: str, name: str, binding: Mapping[str, Any]) -> aiohttp.web.Response:
        self.store.bind(namespace, name, binding)
        return _json(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201
        )

    def _select(
        self, request: kmock.Request, rtype: catalog.ResourceType, ns: str | None, *, copied: bool = True
    ) -> tuple[list[dict[str, Any]], str]:
        labels, fields = parsing.selectors_of(request.params, rtype)
        return self.store.list_objects(rtype, ns, labels, fields, copied=copied)

    def _list(
        self, request: kmock.Request, rtype: catalog.ResourceType, ns: str | None
    ) -> aiohttp.web.Response:
        if parsing.wants_table(request):
            items, rv = self._select(request, rtype, ns, copied=False)  # serialized right away
            return _json(tables.table(rtype, items, rv, request.params.get("includeObject", "Metadata")))
        labels, fields = parsing.selectors_of(request.params, rtype)
        limit, token = _limit(request.params.get("limit")), request.params.get("continue")
        if self.whole_lists:
            limit = None  # a continue token from before the switch still pages on to its end
        self.pages_served[rtype.plural] += 1
        if not token:
            self.lists[rtype.plural] += 1
        if limit or token:  # paged (see paging)
            encoded, rv, token = self.pages.page(self.store, rtype, ns, labels, fields, limit, token)
        else:
            encoded, rv = self.store.list_encoded(rtype, ns, labels, fields)
        # The cached JSON of each object, joined: no object is copied or serialized again.
        head = _list_head(rtype, rv)
        if token:
            head["metadata"]["continue"] = token
        body = orjson.dumps(head)[:-1] + b',"items":[' + b",".join(encoded) + b"]}"
        return aiohttp.web.Response(body=body, content_type="application/json")

    def _answer(
        self, request: kmock.Request, rtype: catalog.ResourceType, obj: dict[str, Any], status: int = 200
    ) -> aiohttp.web.Response:
        if parsing.wants_table(request):
            found = tables.table(
                rtype, [obj], self.store.resource_version, request.params.get("includeObject", "Metadata")
            )
            return _json(found, status)
        return _json(obj, status)

    async def _create(
        self, request: kmock.Request, rtype: catalog.ResourceType, ns: str | None, user: identity.User, manager: str
    ) -> aiohttp.web.Response:
        body = parsing.decode(request)
        if not isinstance(body, dict):
            raise errors.bad_request("the body of a create must be an object")
        parsing.check_strict(request, rtype, body)
        md = body.setdefault("metadata", {})
        if rtype.namespaced and ns and not md.get("namespace"):
            md["namespace"] = ns
        managedfields.track_update(applying.shape_of(rtype), None, body, manager, rtype.api_version,
                                   has_status=rtype.has_status)
        body = await self.admission.admit_create(rtype, ns, body, user)
        registry.check_create(rtype, ns, body)  # the schema answers before validating admission
        await self.admission.validate(rtype, ns, "CREATE", body, user=user)
        return self._answer(request, rtype, self.store.create(rtype, ns, body), 201)
