"""The object store's writes: what etcd plus the generic registry of kube-apiserver do for each write.

One monotonic resourceVersion counter covers every object, list and watch event. A write here is
the order of steps the real registry takes, filed atomically: checks and the object to store come
from ``registry`` (preconditions, immutable metadata, ``generation``, the ``status`` split,
finalizers) and ``strategies`` (defaults, the CRD schema and CEL rules); the store keeps the objects
(and reads them: ``stored``), finishes deletions (finalizers, garbage collection, namespaces, CRDs) and
hands each change to the watch history (``watches``). ``dryrun`` undoes a write made under ``dryRun=All``.

Everything is synchronous: the sandbox runs in one event loop, so each write is atomic, and
watchers get events through ``asyncio.Queue.put_nowait`` in the order of resourceVersions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from deviceshare.sandbox import catalog, dryrun, errors, patches, registry, stored, strategies, watches

Obj = stored.Obj
Key = stored.Key

# Re-exported: where the rest of the sandbox (and its tests) have always found them.
DRY_RUN = dryrun.DRY_RUN
WatchEvent = watches.WatchEvent
Subscription = watches.Subscription
now = strategies.now
clone = strategies.clone
meta = strategies.meta
set_condition = strategies.set_condition


class ObjectStore(stored.StoredObjects):
    def __init__(self, types: catalog.Catalog | None = None, *, history: int = 10_000) -> None:
        super().__init__(types)
        self._watches = watches.WatchHistory(history)
        self.listeners = self._watches.listeners  # in-process watchers (kubelet, controllers): called on every event

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

