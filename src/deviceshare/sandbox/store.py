"""The object store: what etcd plus the generic registry of kube-apiserver do for each write.

One monotonic resourceVersion counter covers every object, list and watch event. A write here is
the order of steps the real registry takes, filed atomically: checks and the object to store come
from ``registry`` (preconditions, immutable metadata, ``generation``, the ``status`` split,
finalizers) and ``strategies`` (defaults, the CRD schema and CEL rules); the store keeps the objects,
finishes deletions (finalizers, garbage collection, namespaces, CRDs) and hands each change to the
watch history (``watches``). ``dryrun`` undoes a write made under ``dryRun=All``.

Everything is synchronous: the sandbox runs in one event loop, so each write is atomic, and
watchers get events through ``asyncio.Queue.put_nowait`` in the order of resourceVersions.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from deviceshare.sandbox import catalog, dryrun, errors, patches, registry, selectors, strategies, watches

Obj = dict[str, Any]
Key = tuple[str, str]  # (group, plural)

# Re-exported: where the rest of the sandbox (and its tests) have always found them.
DRY_RUN = dryrun.DRY_RUN
WatchEvent = watches.WatchEvent
Subscription = watches.Subscription
now = strategies.now
clone = strategies.clone
meta = strategies.meta
set_condition = strategies.set_condition


class ObjectStore:
    def __init__(self, types: catalog.Catalog | None = None, *, history: int = 10_000) -> None:
        self.catalog = types or catalog.Catalog()
        self._objects: dict[Key, dict[tuple[str, str], Obj]] = collections.defaultdict(dict)
        # JSON of stored objects, made as each is written (``_encode``): lists are joins
        self._encoded: dict[Key, dict[tuple[str, str], bytes]] = collections.defaultdict(dict)
        self._rv = 1
        self._watches = watches.WatchHistory(history)
        self.listeners = self._watches.listeners  # in-process watchers (kubelet, controllers): called on every event
        self._dry = False  # inside a dry-run write: nothing is emitted, everything is undone after

    def begin_dry_run(self) -> Callable[[], None] | None:
        """Start a dry-run write (see ``dryrun``): what it returns puts every object, the resourceVersion
        and the served types back as they were. None inside one already: the outermost write undoes."""
        if self._dry:
            return None
        saved = (
            {k: dict(v) for k, v in self._objects.items()},
            {k: dict(v) for k, v in self._encoded.items()},
            self._rv,
            self.catalog,
        )
        self._dry, self.catalog = True, self.catalog.copy()

        def undo() -> None:
            objects, encoded, self._rv, self.catalog = saved
            self._objects = collections.defaultdict(dict, objects)
            self._encoded = collections.defaultdict(dict, encoded)
            self._dry = False

        return undo

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
        keys: list[tuple[str, str]] | None = None,
    ) -> tuple[list[bytes], str]:
        """Like ``list_objects``, as the JSON of each object (cached until the object changes); ``keys``: only
        these, in this order, those still stored (a page of a paged list, see ``paging``)."""
        objects, cache = self._objects[rtype.key], self._encoded[rtype.key]
        result = []
        for key in sorted(objects) if keys is None else keys:
            obj = objects.get(key)
            if obj is None or (namespace and key[0] != namespace):
                continue
            if (labels.requirements and not labels.matches(meta(obj).get("labels"))) or (
                fields.terms and not fields.matches(obj)
            ):
                continue
            line = cache.get(key)
            if line is None:
                line = cache[key] = orjson.dumps(obj)
            result.append(line)
        return result, self.resource_version

    def keys(self, rtype: catalog.ResourceType, namespace: str | None) -> list[tuple[str, str]]:
        """The (namespace, name) of every stored object of a type, sorted."""
        return sorted(k for k in self._objects[rtype.key] if not namespace or k[0] == namespace)

    # ---- watching ------------------------------------------------------------------------
    def subscribe(self, key: Key, since: int | None) -> tuple[Subscription, list[WatchEvent]]:
        """Start receiving events of a resource; with ``since``, also those after that version (or 410 Gone)."""
        return self._watches.subscribe(key, since)

    def unsubscribe(self, sub: Subscription) -> None:
        self._watches.unsubscribe(sub)

    def close_watches(self) -> int:
        """End every open watch (the clients see the stream close and re-watch)."""
        return self._watches.close_watches()

    def open_watches(self, key: Key | None = None) -> int:
        """How many watches are open (on one resource, or on any)."""
        return len(self.subscriptions(key))

    def subscriptions(self, key: Key | None = None) -> list[Subscription]:
        """The open watches (of one resource, or all), each with the queue of events not yet streamed."""
        return self._watches.subscriptions(key)

    def compact(self) -> None:
        """Forget the watch history, so any older resourceVersion gets 410 Gone."""
        self._watches.compact(self._rv)

    def _emit(self, type_: str, rtype: catalog.ResourceType, obj: Obj, old: Obj | None) -> None:
        if self._dry:
            return
        self._watches.record(WatchEvent(int(meta(obj)["resourceVersion"]), rtype.key, type_, clone(obj), old))

    def _encode(self, rtype: catalog.ResourceType, key: tuple[str, str], obj: Obj) -> None:
        """Keep the JSON of ``obj``, just stored under ``key``, for lists to join. Made here, while the object is
        fresh in the CPU's caches: made at the first list instead, it cost the sandbox 2 s at 150,000 pods (the
        objects scattered through 2 GiB), and the client paging through that list waited for it."""
        cache = self._encoded[rtype.key]
        cache.pop(key, None)
        if not self._dry:  # (a dry-run write is undone at once)
            with contextlib.suppress(TypeError):  # not JSON: encoded (and refused) when a list asks, as before
                cache[key] = orjson.dumps(obj)

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    # ---- writing -------------------------------------------------------------------------
    @dryrun.undone_when_dry
    def create(self, rtype: catalog.ResourceType, namespace: str | None, body: Mapping[str, Any]) -> Obj:
        obj = registry.for_create(rtype, namespace, body, lambda ns: ("", ns) in self._objects[("", "namespaces")])
        name = meta(obj)["name"]
        if (meta(obj).get("namespace", ""), name) in self._objects[rtype.key]:
            raise errors.already_exists(rtype.plural, rtype.group, name)
        obj = registry.stamped_for_create(rtype, obj)
        meta(obj)["resourceVersion"] = self._next_rv()
        self._objects[rtype.key][(meta(obj).get("namespace", ""), name)] = obj
        self._encode(rtype, (meta(obj).get("namespace", ""), name), obj)
        if rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            self._serve_crd(obj)
        self._emit("ADDED", rtype, obj, None)
        return clone(obj)

    @dryrun.undone_when_dry
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

    @dryrun.undone_when_dry
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
        # Under a dry run the patch must not touch the stored object through shared nested parts.
        base = clone(old) if DRY_RUN.get() and not self._dry else old
        if content_type is None:
            new = registry.replacement(rtype, name, body)
        else:
            new = patches.apply(content_type, base, body, custom=rtype.custom)
            if not isinstance(new, dict):
                raise errors.bad_request("the patch did not produce an object")
        registry.check_precondition(rtype, old, new)
        return old, registry.merged(rtype, base, new, subresource)

    @dryrun.undone_when_dry
    def commit_update(self, rtype: catalog.ResourceType, old: Obj, new: Obj) -> Obj | None:
        """Store what :meth:`prepare_update` made, unless the object changed meanwhile (then None)."""
        md = meta(old)
        if self._objects[rtype.key].get((md.get("namespace", ""), md["name"])) is not old:
            return None
        return self._commit(rtype, old, new)

    def _commit(self, rtype: catalog.ResourceType, old: Obj, new: Obj) -> Obj:
        """Store an update: bump generation/resourceVersion when something changed, finish deletions."""
        new = registry.validated_update(rtype, old, new)
        if new == old:
            return clone(old)  # a no-op write: no new version, no watch event
        new_md = meta(new)
        new_md["resourceVersion"] = self._next_rv()
        key = (new_md.get("namespace", ""), new_md["name"])
        gone = new_md.get("deletionTimestamp") and not new_md.get("finalizers")
        if gone and not new_md.get("deletionGracePeriodSeconds"):  # (a pod in its grace period stays)
            del self._objects[rtype.key][key]
            self._encoded[rtype.key].pop(key, None)
            self._emit("DELETED", rtype, new, old)
            self._after_delete(rtype, new)
        else:
            self._objects[rtype.key][key] = new
            self._encode(rtype, key, new)
            if rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
                self._serve_crd(new)
            self._emit("MODIFIED", rtype, new, old)
        return clone(new)

    @dryrun.undone_when_dry
    def delete(
        self,
        rtype: catalog.ResourceType,
        namespace: str | None,
        name: str,
        options: Mapping[str, Any] | None = None,
    ) -> Obj:
        old = self._existing(rtype, namespace, name)
        registry.check_delete_preconditions(rtype, name, old, options)
        md = meta(old)
        grace = registry.grace_period(rtype, old, options)  # a pod asked to stop first: its kubelet removes it
        if md.get("deletionTimestamp") and (md.get("finalizers") or grace):
            if grace or not md.get("deletionGracePeriodSeconds"):
                return clone(old)
            shortened = clone(old)  # to now: gone as soon as its finalizers are
            meta(shortened)["deletionGracePeriodSeconds"] = 0
            return self._commit(rtype, old, shortened)
        if not md.get("deletionTimestamp") and (md.get("finalizers") or grace):
            return self._commit(rtype, old, registry.terminating(old, grace))
        del self._objects[rtype.key][(md.get("namespace", ""), name)]
        self._encoded[rtype.key].pop((md.get("namespace", ""), name), None)
        gone = clone(old)
        meta(gone)["resourceVersion"] = self._next_rv()
        self._emit("DELETED", rtype, gone, old)
        self._after_delete(rtype, gone, collect=not registry.orphans(options))
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

    @dryrun.undone_when_dry
    def bind(self, namespace: str, name: str, binding: Mapping[str, Any]) -> None:
        """``pods/binding``: set ``spec.nodeName`` once; a second binding is a 409 like the real API."""
        rtype = self.catalog.lookup("pods")
        old = self._existing(rtype, namespace, name)
        self._commit(rtype, old, registry.bound(old, name, binding))

    def write_status(
        self, rtype: catalog.ResourceType, namespace: str | None, name: str, mutate: Callable[[Obj], None]
    ) -> Obj:
        """An in-process status write (the kubelet's): ``mutate`` edits a copy of the object."""
        old = self._existing(rtype, namespace, name)
        new = clone(old)
        mutate(new)
        return self._commit(rtype, old, registry.merged(rtype, old, new, "status"))


def _same(obj: Obj) -> Obj:
    return obj
