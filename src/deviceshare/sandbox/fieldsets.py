"""Sets of field paths and the walks of sigs.k8s.io/structured-merge-diff over plain JSON trees.

Server-side apply decides conflicts and removals from sets of field paths, one per manager
(``managedfields`` keeps them on the objects, ``applying`` uses them):

- a path is a tuple of FieldsV1 keys: ``f:name`` (a field or map key), ``k:{"name":"c"}`` (a list item
  by its map keys), ``v:"x"`` (a set item); ``fieldsV1`` is the same set as a trie, ``.`` marking a
  node that is itself a member (:func:`to_fields_v1`, :func:`from_fields_v1`);
- :func:`fieldset` is SMD's ``ToFieldSet`` (leaves, list items, free map entries, empty maps and nulls),
  :func:`compare` its ``Compare`` (added / modified / removed), :func:`ensure_named` its
  ``EnsureNamedFieldsAreMembers``, :func:`remove_items` its ``RemoveItems``, :func:`without` its
  ``RecursiveDifference``, :func:`path_string` how it prints a path in a conflict.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from deviceshare.sandbox import strategies
from deviceshare.sandbox.fieldshapes import ATOMIC, KEY_DEFAULTS, MAP, SET, Shape

Path = tuple[str, ...]
MISSING: Any = object()


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def list_elements(shape: Shape, items: Sequence[Any]) -> tuple[str, list[str]]:
    """The list's semantics and one path element per item (an unkeyable item makes the list atomic)."""
    kind, keys = shape.list_semantics(items)
    if kind == SET:
        return SET, ["v:" + _json(i) for i in items]
    if kind == MAP:
        elements = []
        for item in items:
            if not isinstance(item, Mapping):
                return ATOMIC, []
            key = {}
            for k in keys:
                if k in item:
                    key[k] = item[k]
                elif k in KEY_DEFAULTS:
                    key[k] = KEY_DEFAULTS[k]
                else:
                    return ATOMIC, []
            elements.append("k:" + _json(key))
        return MAP, elements
    return ATOMIC, []


def fieldset(value: Any, shape: Shape, path: Path = ()) -> set[Path]:
    """Every path ``value`` sets, as SMD's ToFieldSet counts them."""
    out: set[Path] = set()
    _collect(value, shape, path, out)
    return out


def _collect(value: Any, shape: Shape, path: Path, out: set[Path]) -> None:
    if isinstance(value, dict):
        if shape.atomic_map:
            out.add(path)
            return
        for key, child_value in value.items():
            child, declared = shape.child(key)
            p = (*path, f"f:{key}")
            _collect(child_value, child, p, out)
            if child_value is None or child_value == {} or not declared:
                out.add(p)
    elif isinstance(value, list):
        kind, elements = list_elements(shape, value)
        if kind == ATOMIC:
            out.add(path)
            return
        item = shape.item()
        for element, child_value in zip(elements, value, strict=True):
            p = (*path, element)
            _collect(child_value, item, p, out)
            out.add(p)
    elif path:
        out.add(path)


@dataclasses.dataclass
class Comparison:
    added: set[Path] = dataclasses.field(default_factory=set)
    modified: set[Path] = dataclasses.field(default_factory=set)
    removed: set[Path] = dataclasses.field(default_factory=set)

    @property
    def changed(self) -> set[Path]:
        return self.added | self.modified


def compare(lhs: Any, rhs: Any, shape: Shape) -> Comparison:
    """What changed from ``lhs`` to ``rhs``: SMD's Compare (unchanged subtrees are skipped)."""
    result = Comparison()
    _compare(lhs, rhs, shape, (), result)
    return result


def _leaf(lhs: Any, rhs: Any, path: Path, result: Comparison) -> None:
    if lhs is MISSING:
        result.added.add(path)
    elif rhs is MISSING:
        result.removed.add(path)
    elif lhs != rhs:
        result.modified.add(path)


def _compare(lhs: Any, rhs: Any, shape: Shape, path: Path, result: Comparison) -> None:
    lhs_missing, rhs_missing = lhs is MISSING, rhs is MISSING
    if not lhs_missing and not rhs_missing and lhs == rhs:
        return
    left = {} if lhs_missing else lhs
    right = {} if rhs_missing else rhs
    if type(left) is dict and type(right) is dict and (left or right) and not shape.atomic_map:
        for key in {**left, **right}:
            _compare(left.get(key, MISSING), right.get(key, MISSING), shape.child(key)[0], (*path, f"f:{key}"),
                     result)
    else:
        left = [] if lhs_missing else lhs
        right = [] if rhs_missing else rhs
        if type(left) is not list or type(right) is not list or not (left or right):
            _leaf(lhs, rhs, path, result)
            return
        kind, elements = list_elements(shape, left + right)
        if kind == ATOMIC:
            _leaf(lhs, rhs, path, result)
            return
        left_items = dict(zip(elements[: len(left)], left, strict=True))
        right_items = dict(zip(elements[len(left):], right, strict=True))
        item = shape.item()
        for element in {**left_items, **right_items}:
            _compare(left_items.get(element, MISSING), right_items.get(element, MISSING), item,
                     (*path, element), result)
    if path and lhs_missing:
        result.added.add(path)
    elif path and rhs_missing:
        result.removed.add(path)


def ensure_named(paths: Iterable[Path], shape: Shape) -> set[Path]:
    """``paths`` plus every ancestor that is a declared struct field (SMD's EnsureNamedFieldsAreMembers)."""
    out = set(paths)
    for path in list(out):
        node = shape
        for i, element in enumerate(path[:-1]):
            if element.startswith("f:"):
                node, declared = node.child(element[2:])
                if declared:
                    out.add(path[: i + 1])
            else:
                node = node.item()
    return out


def remove_items(value: Any, removal: set[Path], shape: Shape) -> Any:
    """A copy of ``value`` without the fields, map entries and list items whose paths are in ``removal``."""
    prefixes = {p[:i] for p in removal for i in range(len(p))}
    return _remove(value, removal, prefixes, shape, ())


def _remove(value: Any, removal: set[Path], prefixes: set[Path], shape: Shape, path: Path) -> Any:
    if path not in prefixes:
        return strategies.clone(value)
    if isinstance(value, dict):
        out = {}
        for key, child_value in value.items():
            p = (*path, f"f:{key}")
            if p not in removal:
                out[key] = _remove(child_value, removal, prefixes, shape.child(key)[0], p)
        return out
    if isinstance(value, list):
        kind, elements = list_elements(shape, value)
        if kind == ATOMIC:
            return strategies.clone(value)
        item = shape.item()
        return [_remove(v, removal, prefixes, item, (*path, e))
                for e, v in zip(elements, value, strict=True) if (*path, e) not in removal]
    return value


def without(paths: Iterable[Path], prefixes: Iterable[Path]) -> set[Path]:
    """``paths`` less those under any of ``prefixes`` (SMD's RecursiveDifference) and bare ``metadata``."""
    cut = set(prefixes)
    lengths = {len(c) for c in cut}
    return {p for p in paths if p != ("f:metadata",) and not any(p[:n] in cut for n in lengths)}


def path_string(path: Path) -> str:
    """A path as SMD prints it in conflicts: ``.spec.containers[name="c"].image``."""
    parts = []
    for element in path:
        tag, text = element[:2], element[2:]
        if tag == "f:":
            parts.append("." + text)
        elif tag == "k:":
            fields = json.loads(text)
            parts.append("[" + ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(fields.items())) + "]")
        elif tag == "v:":
            parts.append(f"[={text}]")
        else:
            parts.append(f"[{text}]")
    return "".join(parts)


def to_fields_v1(paths: Iterable[Path]) -> dict[str, Any]:
    trie: dict[str, Any] = {}
    for path in paths:
        node = trie
        for element in path:
            node = node.setdefault(element, {})
        node["."] = {}
    return _tidy(trie)


def _tidy(node: Mapping[str, Any]) -> dict[str, Any]:
    children = {k: _tidy(v) for k, v in sorted(node.items()) if k != "."}
    return {".": {}, **children} if "." in node and children else children


def from_fields_v1(trie: Mapping[str, Any], prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for key, child in trie.items():
        if key == ".":
            if prefix:
                out.add(prefix)
        elif child:
            out |= from_fields_v1(child, (*prefix, key))
        else:
            out.add((*prefix, key))
    return out
