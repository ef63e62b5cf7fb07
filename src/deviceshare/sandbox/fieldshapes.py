"""What server-side apply needs to know of a type: which maps are structs, which lists merge by key.

kube-apiserver gives structured-merge-diff a schema per kind: a struct's *declared* fields versus a
map's free keys, and for every list its ``listType`` (``atomic`` — replaced whole, ``set`` — merged by
value, ``map`` — merged by the ``listMapKeys`` of its items). Custom resources take this from the CRD's
``openAPIV3Schema`` (``x-kubernetes-list-type`` / ``-list-map-keys`` / ``-map-type``; a CRD list without
a list type is atomic, an object with ``x-kubernetes-preserve-unknown-fields`` and no properties is a
free map). The sandbox has no schemas of built-in kinds, so for them the shape is chosen by field name
with the strategic-merge keys it already knows (``patches.MERGE_KEYS``) plus the few list keys apply
relies on that strategic merge does not use: every other built-in list is atomic, every object a
struct unless it is one of the well-known string maps (labels, annotations, data, selectors...).
``metadata`` is always ObjectMeta, whatever a CRD's schema says of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from deviceshare.sandbox import patches

# Built-in list fields that merge by key under server-side apply (listType=map in the Go types).
LIST_KEYS: dict[str, tuple[str, ...]] = {
    **{field: (key,) for field, key in patches.MERGE_KEYS.items()},
    "webhooks": ("name",),
    "matchConditions": ("name",),
    "versions": ("name",),
}
# Built-in list fields that merge as sets of scalars (listType=set).
SET_LISTS = frozenset(patches.PRIMITIVE_MERGE)
# Key fields with a default value that apply fills in when an item omits them.
KEY_DEFAULTS: dict[str, Any] = {"protocol": "TCP"}
# Built-in fields that are maps with free keys (map[string]T), not structs with declared fields.
BUILTIN_MAPS = frozenset(
    {
        "labels",
        "annotations",
        "data",
        "binaryData",
        "stringData",
        "nodeSelector",
        "matchLabels",
        "limits",
        "requests",
        "capacity",
        "allocatable",
        "hard",
        "used",
        "overhead",
        "parameters",
    }
)
ATOMIC = "atomic"
SET = "set"
MAP = "map"


@dataclasses.dataclass(frozen=True)
class Shape:
    """The type of one node: ``schema`` is a CRD schema node, or None for a built-in (by ``name``)."""

    schema: Mapping[str, Any] | None = None
    name: str = ""
    custom: bool = False
    free: bool = False  # a map with free keys (built-in heuristic, or a schemaless CRD node)
    # Children looked up before (every tracked write walks the same few shapes).
    _children: dict[str, tuple[Shape, bool]] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def child(self, key: str) -> tuple[Shape, bool]:
        """The shape under ``key`` and whether ``key`` is a declared field (a struct's, not a map's)."""
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = self._child(key)
        return found

    def _child(self, key: str) -> tuple[Shape, bool]:
        if not self.custom:
            return Shape(None, key, free=key in BUILTIN_MAPS), not self.free
        node = self.schema or {}
        properties = node.get("properties") or {}
        if key in properties:
            return Shape(properties[key], key, custom=True), True
        extra = node.get("additionalProperties")
        if isinstance(extra, Mapping):
            return Shape(extra, key, custom=True), False
        return Shape({"x-kubernetes-preserve-unknown-fields": True}, key, custom=True), False

    def item(self) -> Shape:
        """The shape of a list's items."""
        if not self.custom:
            return Shape(None, "")
        items = (self.schema or {}).get("items")
        return Shape(items if isinstance(items, Mapping) else {}, "", custom=True)

    @property
    def atomic_map(self) -> bool:
        return bool(self.custom and (self.schema or {}).get("x-kubernetes-map-type") == "atomic")

    def list_semantics(self, items: Sequence[Any]) -> tuple[str, tuple[str, ...]]:
        """(``atomic`` | ``set`` | ``map``, the map keys) of this list field."""
        if self.custom:
            node = self.schema or {}
            kind = node.get("x-kubernetes-list-type", ATOMIC)
            keys = tuple(sorted(node.get("x-kubernetes-list-map-keys") or ()))
            if kind == MAP and keys:
                return MAP, keys
            return (SET, ()) if kind == SET else (ATOMIC, ())
        if self.name in SET_LISTS:
            return SET, ()
        if self.name == "ports":  # containers' ports by containerPort, a Service's by port
            sample = next((i for i in items if isinstance(i, Mapping)), {})
            return MAP, (("containerPort" if "containerPort" in sample else "port"), "protocol")
        named = LIST_KEYS.get(self.name)
        return (MAP, tuple(sorted(named))) if named else (ATOMIC, ())


OBJECT_META = Shape(None, "metadata")


_ROOTS: dict[int, tuple[Mapping[str, Any] | None, Shape]] = {}


def root(schema: Mapping[str, Any] | None) -> Shape:
    """The shape of a whole object: a CRD's schema, or a built-in kind (``schema`` None); one per schema,
    so its looked-up children are kept (the entry holds the schema, so its id is not reused)."""
    found = _ROOTS.get(id(schema))
    if found is None or found[0] is not schema:
        if len(_ROOTS) > 256:  # CRDs come and go in tests: keep the cache small
            _ROOTS.clear()
        found = _ROOTS[id(schema)] = (schema, _Root(schema, "", custom=schema is not None))
    return found[1]


@dataclasses.dataclass(frozen=True)
class _Root(Shape):
    def _child(self, key: str) -> tuple[Shape, bool]:
        if key == "metadata":
            return OBJECT_META, True
        return Shape._child(self, key)
