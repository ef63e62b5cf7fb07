"""The object store: what etcd plus the generic registry of kube-apiserver do for each write.

One monotonic resourceVersion counter covers every object, list and watch event. Writes check
the optimistic-concurrency precondition (409 on a stale resourceVersion), keep ``uid``,
``creationTimestamp`` and friends immutable, bump ``generation`` on spec changes only, split
the ``status`` subresource from the main resource, honour finalizers with ``deletionTimestamp``,
and validate custom objects against their CRD schema and CEL rules (422).

Everything is synchronous: the sandbox runs in one event loop, so each write is atomic, and
watchers get events through ``asyncio.Queue.put_nowait`` in the order of resourceVersions.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import dataclasses
import json
import random
import uuid
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import Any, Concatenate, ParamSpec, TypeVar

from deviceshare.sandbox import catalog, errors, patches, selectors, strategies

Obj = dict[str, Any]
Key = tuple[str, str]  # (group, plural)


# ``dryRun=All`` for the request being served (set per request by the API server; a context variable, so
# in-process writers such as the kubelet, running in other tasks, are never affected).
DRY_RUN: contextvars.ContextVar[bool] = contextvars.ContextVar("deviceshare_sandbox_dry_run", default=False)
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _undone_when_dry(
    write: Callable[Concatenate[ObjectStore, _P], _R],
) -> Callable[Concatenate[ObjectStore, _P], _R]:
    """Server-side dry run: the write runs every check and answers as if stored, then is undone, with no
    watch event sent and no resourceVersion used (what ``kubectl apply --dry-run=server`` relies on)."""

    def wrapper(self: ObjectStore, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if not DRY_RUN.get() or self._dry:
            return write(self, *args, **kwargs)
        saved = (
            {k: dict(v) for k, v in self._objects.items()},
            {k: dict(v) for k, v in self._encoded.items()},
            self._rv,
            self.catalog,
        )
        self._dry, self.catalog = True, self.catalog.copy()
        try:
            return write(self, *args, **kwargs)
        finally:
            objects, encoded, self._rv, self.catalog = saved
            self._objects = collections.defaultdict(dict, objects)
            self._encoded = collections.defaultdict(dict, encoded)
            self._dry = False

    return wrapper


now = strategies.now
clone = strategies.clone
meta = strategies.meta
set_condition = strategies.set_condition


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    rv: int
    key: Key
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj
    old: Obj | None = None

    @cached_property
    def line(self) -> bytes:
        return json.dumps({"type": self.type, "object": self.obj}).encode() + b"\n"


@dataclasses.dataclass(eq=False)
class Subscription:
    key: Key
    queue: asyncio.Queue[WatchEvent | None] = dataclasses.field(default_factory=asyncio.Queue)
    closed: bool = False  # the server ended this watch: undelivered events are dropped


class ObjectStore:
    def __init__(self, types: catalog.Catalog | None = None, *, history: int = 10_000) -> None:
        self.catalog = types or catalog.Catalog()
        self._objects: dict[Key, dict[tuple[str, str], Obj]] = collections.defaultdict(dict)
        # JSON of stored objects, made on first read and dropped on every write: lists are joins
        self._encoded: dict[Key, dict[tuple[str, str], bytes]] = collections.defaultdict(dict)
        self._rv = 1
        self._history: collections.deque[WatchEvent] = collections.deque()
        self._history_limit = history
        self._compacted = 0
        self._subscriptions: list[Subscription] = []
        self.listeners: list[Callable[[WatchEvent], None]] = []
        self._dry = False  # inside a dry-run write: nothing is emitted, everything is undone after

    # ---- reading -------------------------------------------------------------------------
    @property
    def resource_version(self) -> str:
        return str(self._rv)

    def rtype(self, name: str) -> catalog.ResourceType:
        try:
            return self.catalog.lookup(name)
        except KeyError:
            raise errors.ApiError(
                404, "NotFound", f"the server doesn't have a resource type {name!r}"
            ) from None

    def _existing(self, rtype: catalog.ResourceType, namespace: str | None, name: str) -> Obj:
        found = self._objects[rtype.key].get((namespace or "", name))
        if found is None:
            raise errors.not_found(rtype.plural, rtype.group, name)
        # A dry-run write works on a copy: patches share nested parts with their target, and the write
        # path edits those (metadata) in place; the stored original must come back untouched.
        return clone(found) if self._dry else found

    def get(self, rtype: catalog.ResourceType, namespace: str | None, name: str) -> Obj:
        return clone(self._existing(rtype, namespace, name))

    def list_objects(
        self,
        rtype: catalog.ResourceType,
        namespace: str | None = None,
        labels: selectors.LabelSelector | None = None,
        fields: selectors.FieldSelector | None = None,
        *,
        copied: bool = True,
    ) -> tuple[list[Obj], str]:
        """Matching objects by (namespace, name); ``copied=False`` hands out the stored dicts
        (only for callers that serialize them at once, before any other write)."""
        copier = clone if copied else _same
        items = [
            copier(obj)
            for (ns, _), obj in sorted(self._objects[rtype.key].items())
            if (not namespace or ns == namespace)
            and (labels is None or labels.matches(meta(obj).get("labels")))
            and (fields is None or fields.matches(obj))
        ]
        return items, self.resource_version

    def list_encoded(
        self,
        rtype: catalog.ResourceType,
        namespace: str | None,
        labels: selectors.LabelSelector,
        fields: selectors.FieldSelector,
    ) -> tuple[list[bytes], str]:
        """Like ``list_objects``, as the JSON of each object (cached until the object changes)."""
        objects, cache = self._objects[rtype.key], self._encoded[rtype.key]
        result = []
        for key in sorted(objects):
            obj = objects[key]
            if namespace and key[0] != namespace:
                continue
            if (labels.requirements and not labels.matches(meta(obj).get("labels"))) or (
                fields.terms and not fields.matches(obj)
            ):
                continue
            line = cache.get(key)
            if line is None:
                line = cache[key] = json.dumps(obj).encode()
            result.append(line)
        return result, self.resource_version

    # ---- watching ------------------------------------------------------------------------
    def subscribe(self, key: Key, since: int | None) -> tuple[Subscription, list[WatchEvent]]:
        """Start receiving events of a resource; with ``since``, also those after that version.

        A version older than the retained history is answered 410 Gone, as etcd compaction does.
        """
        backlog: list[WatchEvent] = []
        if since is not None:
            if since < self._compacted:
                raise errors.gone(f"too old resource version: {since} ({self._compacted + 1})")
            backlog = [e for e in self._history if e.rv > since and e.key == key]
        sub = Subscription(key)
        self._subscriptions.append(sub)
        return sub, backlog

    def unsubscribe(self, sub: Subscription) -> None:
        if sub in self._subscriptions:
            self._subscriptions.remove(sub)

    def close_watches(self) -> int:
        """End every open watch (the clients see the stream close and re-watch)."""
        subs, self._subscriptions = self._subscriptions, []
        for sub in subs:
            sub.closed = True
            sub.queue.put_nowait(None)
        return len(subs)

    def compact(self) -> None:
        """Forget the watch history, so any older resourceVersion gets 410 Gone."""
        self._history.clear()
        self._compacted = self._rv

    def _emit(self, type_: str, rtype: catalog.ResourceType, obj: Obj, old: Obj | None) -> None:
        if self._dry:
            return
        event = WatchEvent(int(meta(obj)["resourceVersion"]), rtype.key, type_, clone(obj), old)
        self._history.append(event)
        while len(self._history) > self._history_limit:
            self._compacted = self._history.popleft().rv
        for sub in self._subscriptions:
            if sub.key == rtype.key:
                sub.queue.put_nowait(event)
        for listener in list(self.listeners):
            listener(event)

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    # ---- writing -------------------------------------------------------------------------
    @_undone_when_dry
    def create(self, rtype: catalog.ResourceType, namespace: str | None, body: Mapping[str, Any]) -> Obj:
        obj: Obj = clone(dict(body))
        md = obj.setdefault("metadata", {})
        if not isinstance(md, dict):
            raise errors.bad_request("metadata must be an object")
        if rtype.namespaced:
            ns = namespace or md.get("namespace") or "default"
            if md.get("namespace") and md["namespace"] != ns:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            if ("", ns) not in self._objects[("", "namespaces")]:
                raise errors.not_found("namespaces", "", ns)
            md["namespace"] = ns
        else:
            md.pop("namespace", None)
        if not md.get("name") and md.get("generateName"):
            md["name"] = md["generateName"] + "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
        name = md.get("name")
        if not name:
            raise errors.invalid(
                rtype.kind,
                rtype.group,
                "",
                [("metadata.name", "Required value: name or generateName is required")],
            )
        if (md.get("namespace", ""), name) in self._objects[rtype.key]:
            raise errors.already_exists(rtype.plural, rtype.group, name)
        obj["apiVersion"], obj["kind"] = rtype.api_version, rtype.kind
        for field in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
            md.pop(field, None)
        md.update(uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
        obj = strategies.prepare_for_create(rtype, obj)
        obj = strategies.validated(rtype, obj, None)
        meta(obj)["resourceVersion"] = self._next_rv()
        self._objects[rtype.key][(meta(obj).get("namespace", ""), name)] = obj
        self._encoded[rtype.key].pop((meta(obj).get("namespace", ""), name), None)
        if rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            self._serve_crd(obj)
        self._emit("ADDED", rtype, obj, None)
        return clone(obj)

    @_undone_when_dry
    def replace(
        self,
        rtype: catalog.ResourceType,
        namespace: str | None,
        name: str,
        body: Mapping[str, Any],
        subresource: str | None = None,
    ) -> Obj:
        old, new = self.prepare_update(rtype, namespace, name, None, body, subresource)
        return self._commit(rtype, old, new)

    @_undone_when_dry
    def patch(
        self,
        rtype: catalog.ResourceType,
        namespace: str | None,
        name: str,
        content_type: str,
        body: Any,
        subresource: str | None = None,
    ) -> Obj:
        old, new = self.prepare_update(rtype, namespace, name, content_type, body, subresource)
        return self._commit(rtype, old, new)

    def prepare_update(
        self,
        rtype: catalog.ResourceType,
        namespace: str | None,
        name: str,
        content_type: str | None,
        body: Any,
        subresource: str | None = None,
    ) -> tuple[Obj, Obj]:
        """The stored object and what a PUT (``content_type`` None) or PATCH would make of it, not
        yet stored: admission sees the result first, then :meth:`commit_update` stores it."""
        old = self._existing(rtype, namespace, name)
        if content_type is None:
            new: Obj = clone(dict(body))
            if meta(new).get("name", name) != name:
                raise errors.bad_request(
                    f"the name of the object ({meta(new).get('name')}) does not match the name "
                    f"on the URL ({name})"
                )
            if rtype.custom and not meta(new).get("resourceVersion"):  # CRs allow no unconditional update
                raise errors.invalid(
                    rtype.kind,
                    rtype.group,
                    name,
                    [("metadata.resourceVersion", "Invalid value: 0x0: must be specified for an update")],
                )
        else:
            new = patches.apply(content_type, old, body, custom=rtype.custom)
            if not isinstance(new, dict):
                raise errors.bad_request("the patch did not produce an object")
        self._check_precondition(rtype, old, new)
        return old, self._merged(rtype, old, new, subresource)

    def commit_update(self, rtype: catalog.ResourceType, old: Obj, new: Obj) -> Obj | None:
        """Store what :meth:`prepare_update` made, unless the object changed meanwhile (then None)."""
        md = meta(old)
        if self._objects[rtype.key].get((md.get("namespace", ""), md["name"])) is not old:
            return None
        return self._commit(rtype, old, new)

    def _check_precondition(self, rtype: catalog.ResourceType, old: Obj, new: Obj) -> None:
        wanted = meta(new).get("resourceVersion")
        if wanted and str(wanted) != meta(old)["resourceVersion"]:
            raise errors.conflict(rtype.plural, rtype.group, meta(old)["name"], errors.STALE)

    def _update(self, rtype: catalog.ResourceType, old: Obj, new: Obj, subresource: str | None) -> Obj:
        return self._commit(rtype, old, self._merged(rtype, old, new, subresource))

    def _merged(self, rtype: catalog.ResourceType, old: Obj, new: Obj, subresource: str | None) -> Obj:
        """The object a write of ``new`` to ``subresource`` stores (status split, immutable fields)."""
        if subresource == "ephemeralcontainers":  # only spec.ephemeralContainers changes through it
            containers = (new.get("spec") or {}).get("ephemeralContainers")
            new = clone(old)
            new.setdefault("spec", {})["ephemeralContainers"] = containers
            if containers is None:
                new["spec"].pop("ephemeralContainers")
        elif subresource == "status":
            status = new.get("status")
            new = clone(old)
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
        else:
            new.setdefault("metadata", {})
            if rtype.has_status:
                if "status" in old:
                    new["status"] = clone(old["status"])
                else:
                    new.pop("status", None)
            if rtype.key == ("", "pods"):
                strategies.check_pod_update(old, new)
        old_md, new_md = meta(old), meta(new)
        for field in (
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "name",
            "namespace",
        ):
            if field in old_md:
                new_md[field] = old_md[field]
            else:
                new_md.pop(field, None)
        if old_md.get("deletionTimestamp"):
            added = set(new_md.get("finalizers") or []) - set(old_md.get("finalizers") or [])
            if added:
                raise errors.invalid(
                    rtype.kind,
                    rtype.group,
                    old_md["name"],
                    [
                        (
                            "metadata.finalizers",
                            f"Forbidden: no new finalizers can be added if the object is being "
                            f"deleted, found new finalizers {sorted(added)!r}",
                        )
                    ],
                )
        new["apiVersion"], new["kind"] = rtype.api_version, rtype.kind
        return new

    def _commit(self, rtype: catalog.ResourceType, old: Obj, new: Obj) -> Obj:
        """Store an update: bump generation/resourceVersion when something changed, finish deletions."""
        new = strategies.validated(rtype, new, old)
        new_md = meta(new)
        new_md["resourceVersion"] = meta(old)["resourceVersion"]
        new_md["generation"] = meta(old).get("generation", 1)
        if _spec_part(new) != _spec_part(old):
            new_md["generation"] = int(meta(old).get("generation", 1)) + 1
        if new == old:
            return clone(old)  # a no-op write: no new version, no watch event
        new_md = meta(new)
        new_md["resourceVersion"] = self._next_rv()
        key = (new_md.get("namespace", ""), new_md["name"])
        if new_md.get("deletionTimestamp") and not new_md.get("finalizers"):
            del self._objects[rtype.key][key]
            self._encoded[rtype.key].pop(key, None)
            self._emit("DELETED", rtype, new, old)
            self._after_delete(rtype, new)
        else:
            self._objects[rtype.key][key] = new
            self._encoded[rtype.key].pop(key, None)
            if rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
                self._serve_crd(new)
            self._emit("MODIFIED", rtype, new, old)
        return clone(new)

    @_undone_when_dry
    def delete(
        self,
        rtype: catalog.ResourceType,
        namespace: str | None,
        name: str,
        options: Mapping[str, Any] | None = None,
    ) -> Obj:
        old = self._existing(rtype, namespace, name)
        pre = (options or {}).get("preconditions") or {}
        md = meta(old)
        if pre.get("uid") and pre["uid"] != md.get("uid"):
            raise errors.conflict(
                rtype.plural,
                rtype.group,
                name,
                f"Precondition failed: UID in precondition: "
                f"{pre['uid']}, UID in object meta: {md.get('uid')}",
            )
        if pre.get("resourceVersion") and str(pre["resourceVersion"]) != md["resourceVersion"]:
            raise errors.conflict(rtype.plural, rtype.group, name, errors.STALE)
        if md.get("finalizers"):
            if md.get("deletionTimestamp"):
                return clone(old)
            new = clone(old)
            meta(new).update(deletionTimestamp=now(), deletionGracePeriodSeconds=0)
            return self._commit(rtype, old, new)
        del self._objects[rtype.key][(md.get("namespace", ""), name)]
        self._encoded[rtype.key].pop((md.get("namespace", ""), name), None)
        gone = clone(old)
        meta(gone)["resourceVersion"] = self._next_rv()
        self._emit("DELETED", rtype, gone, old)
        orphan = (options or {}).get("propagationPolicy") == "Orphan" or (options or {}).get(
            "orphanDependents"
        )
        self._after_delete(rtype, gone, collect=not orphan)
        return clone(gone)

    def _after_delete(self, rtype: catalog.ResourceType, obj: Obj, *, collect: bool = True) -> None:
        if collect:
            self._collect_dependents(meta(obj).get("uid"))
        if rtype.key == ("", "namespaces"):
            for other in self.catalog:
                if other.namespaced:
                    for ns, name in [k for k in self._objects[other.key] if k[0] == meta(obj)["name"]]:
                        if (ns, name) in self._objects[other.key]:
                            self.delete(other, ns, name)
        elif rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            spec = obj.get("spec", {})
            served = (spec.get("group", ""), spec.get("names", {}).get("plural", ""))
            for ns, name in list(self._objects[served]):
                gone = self._objects[served].pop((ns, name))
                self._encoded[served].pop((ns, name), None)
                meta(gone)["resourceVersion"] = self._next_rv()
                self._emit("DELETED", next(iter(catalog.from_crd(obj))), gone, None)
            self.catalog.remove_group_plural(*served)

    def _collect_dependents(self, owner_uid: str | None) -> None:
        """The garbage collector, done at once: objects whose owners are all gone are deleted."""
        if not owner_uid:
            return
        doomed = []
        for other in self.catalog:
            for (ns, name), obj in self._objects[other.key].items():
                refs = meta(obj).get("ownerReferences") or []
                if any(r.get("uid") == owner_uid for r in refs) and not any(
                    r.get("uid") != owner_uid and self._uid_alive(r.get("uid")) for r in refs
                ):
                    doomed.append((other, ns, name))
        for other, ns, name in doomed:
            if (ns, name) in self._objects[other.key]:
                self.delete(other, ns or None, name)

    def _uid_alive(self, uid: str | None) -> bool:
        return any(meta(o).get("uid") == uid for objects in self._objects.values() for o in objects.values())

    def _serve_crd(self, crd: Obj) -> None:
        spec = crd.get("spec", {})
        self.catalog.remove_group_plural(spec.get("group", ""), spec.get("names", {}).get("plural", ""))
        for rtype in catalog.from_crd(crd):
            self.catalog.add(rtype)

    @_undone_when_dry
    def bind(self, namespace: str, name: str, binding: Mapping[str, Any]) -> None:
        """``pods/binding``: set ``spec.nodeName`` once; a second binding is a 409 like the real API."""
        rtype = self.catalog.lookup("pods")
        old = self._existing(rtype, namespace, name)
        target = (binding.get("target") or {}).get("name")
        if not target:
            raise errors.invalid("Binding", "", name, [("target.name", "Required value")])
        bound = old.get("spec", {}).get("nodeName")
        if bound:
            raise errors.conflict(
                "pods/binding", "", name, f'pod {name} is already assigned to node "{bound}"'
            )
        uid = meta(binding).get("uid")
        if uid and uid != meta(old).get("uid"):
            raise errors.conflict("pods/binding", "", name, "Precondition failed: UID mismatch")
        new = clone(old)
        new.setdefault("spec", {})["nodeName"] = target
        annotations = meta(binding).get("annotations") or {}
        if annotations:
            meta(new).setdefault("annotations", {}).update(annotations)
        set_condition(new, "PodScheduled", "True")
        self._commit(rtype, old, new)

    def write_status(
        self, rtype: catalog.ResourceType, namespace: str | None, name: str, mutate: Callable[[Obj], None]
    ) -> Obj:
        """An in-process status write (the kubelet's): ``mutate`` edits a copy of the object."""
        old = self._existing(rtype, namespace, name)
        new = clone(old)
        mutate(new)
        return self._update(rtype, old, new, "status")


def _same(obj: Obj) -> Obj:
    return obj


def _spec_part(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}
