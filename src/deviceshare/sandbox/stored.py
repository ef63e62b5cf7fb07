"""What the object store holds and how it is read: the objects of each type by (namespace, name), the JSON
of each made as it is stored (lists are joins of those), the one resourceVersion counter, and the snapshot a
dry-run write is undone to.

``store.ObjectStore`` builds on this with the writes (the order of steps kube-apiserver's registry takes) and
the watches; the rest of the sandbox uses that class, never this one alone.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable
from typing import Any

import orjson

from deviceshare.sandbox import catalog, errors, selectors, strategies

Obj = dict[str, Any]
Key = tuple[str, str]  # (group, plural)

clone = strategies.clone
meta = strategies.meta


class StoredObjects:
    def __init__(self, types: catalog.Catalog | None = None) -> None:
        self.catalog = types or catalog.Catalog()
        self._objects: dict[Key, dict[tuple[str, str], Obj]] = collections.defaultdict(dict)
        # JSON of stored objects, made as each is written (``_encode``): lists are joins
        self._encoded: dict[Key, dict[tuple[str, str], bytes]] = collections.defaultdict(dict)
        self._rv = 1
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


def _same(obj: Obj) -> Obj:
    return obj
