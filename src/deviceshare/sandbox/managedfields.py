"""Field ownership as kube-apiserver records it: ``metadata.managedFields`` and the sets behind it.

Server-side apply decides conflicts and removals from *sets of field paths*, one per manager, kept on
each object as ``metadata.managedFields`` entries (``manager``, ``operation`` Apply or Update,
``apiVersion``, ``time``, ``subresource``, ``fieldsV1``). This module holds those sets and the walks of
sigs.k8s.io/structured-merge-diff that make them, on plain JSON trees:

- a path is a tuple of FieldsV1 keys: ``f:name`` (a field or map key), ``k:{"name":"c"}`` (a list item
  by its map keys), ``v:"x"`` (a set item); ``fieldsV1`` is the same set as a trie, ``.`` marking a
  node that is itself a member (:func:`to_fields_v1`, :func:`from_fields_v1`);
- :func:`fieldset` is SMD's ``ToFieldSet`` (leaves, list items, free map entries, empty maps and nulls),
  :func:`compare` its ``Compare`` (added / modified / removed), :func:`ensure_named` its
  ``EnsureNamedFieldsAreMembers``, :func:`remove_items` its ``RemoveItems``;
- :func:`track_update` is what every create, update and patch does to ``managedFields`` (operation
  Update: the writer takes the fields it changed from everyone else). Apply itself is in ``applying``.

Writes the sandbox makes in-process (its kubelet, Deployment controller, test conveniences) record no
ownership, and the binding subresource records none (as on kube-apiserver).
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
APPLY, UPDATE = "Apply", "Update"
# Fields no manager owns (SMD's stripMeta set), as path prefixes.
STRIPPED: tuple[Path, ...] = (
    ("f:apiVersion",),
    ("f:kind",),
    *(
        ("f:metadata", f"f:{name}")
        for name in (
            "name", "namespace", "creationTimestamp", "selfLink", "uid", "generation", "managedFields",
            "resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds",
        )
    ),
)


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
    if lhs is not MISSING and rhs is not MISSING and lhs == rhs:
        return
    sides = [v for v in (lhs, rhs) if v is not MISSING]
    if all(isinstance(v, dict) for v in sides) and not shape.atomic_map and any(sides):
        left = lhs if lhs is not MISSING else {}
        right = rhs if rhs is not MISSING else {}
        for key in {**left, **right}:
            child, _ = shape.child(key)
            _compare(left.get(key, MISSING), right.get(key, MISSING), child, (*path, f"f:{key}"), result)
    elif all(isinstance(v, list) for v in sides) and any(sides):
        left = lhs if lhs is not MISSING else []
        right = rhs if rhs is not MISSING else []
        kind, _ = list_elements(shape, left + right)
        if kind == ATOMIC:
            _leaf(lhs, rhs, path, result)
            return
        left_items = dict(zip(list_elements(shape, left)[1], left, strict=True))
        right_items = dict(zip(list_elements(shape, right)[1], right, strict=True))
        item = shape.item()
        for element in {**left_items, **right_items}:
            _compare(left_items.get(element, MISSING), right_items.get(element, MISSING), item,
                     (*path, element), result)
    else:
        _leaf(lhs, rhs, path, result)
        return
    if path and lhs is MISSING:
        result.added.add(path)
    elif path and rhs is MISSING:
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
    cut = tuple(prefixes)
    return {p for p in paths if p != ("f:metadata",) and not any(p[: len(c)] == c for c in cut)}


def ignored(has_status: bool, subresource: str | None) -> tuple[Path, ...]:
    """What a write to the main resource or a subresource never owns (the strategy's reset fields)."""
    if subresource == "status":
        return (*STRIPPED, ("f:spec",))
    return (*STRIPPED, ("f:status",)) if has_status else STRIPPED


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


@dataclasses.dataclass
class Entry:
    manager: str
    operation: str
    api_version: str
    paths: set[Path]
    time: str | None = None
    subresource: str = ""

    @property
    def identity(self) -> tuple[str, str, str, str]:
        """Appliers are one manager whatever version they applied; updaters are one per version."""
        return (self.manager, self.operation, self.subresource, self.api_version if self.operation == UPDATE else "")

    def printed(self) -> str:
        """How conflicts name a manager (kube-apiserver's printManager)."""
        text = json.dumps(self.manager)
        if self.subresource:
            text += f" with subresource {json.dumps(self.subresource)}"
        return f"{text} using {self.api_version}" if self.operation == UPDATE else text


Entries = dict[tuple[str, str, str, str], Entry]


def decode(managed: Any) -> Entries:
    entries: Entries = {}
    for raw in managed or []:
        if not isinstance(raw, Mapping) or not raw.get("manager"):
            continue
        entry = Entry(str(raw["manager"]), str(raw.get("operation", UPDATE)), str(raw.get("apiVersion", "")),
                      from_fields_v1(raw.get("fieldsV1") or {}), raw.get("time"), str(raw.get("subresource", "")))
        entries[entry.identity] = entry
    return entries


def encode(entries: Entries) -> list[dict[str, Any]]:
    """The entries as stored: Apply before Update, then by time, manager, version, subresource."""
    ordered = sorted((e for e in entries.values() if e.paths),
                     key=lambda e: (e.operation, e.time or "", e.manager, e.api_version, e.subresource))
    out = []
    for e in ordered:
        raw: dict[str, Any] = {"manager": e.manager, "operation": e.operation, "apiVersion": e.api_version}
        if e.time:
            raw["time"] = e.time
        raw.update(fieldsType="FieldsV1", fieldsV1=to_fields_v1(e.paths))
        if e.subresource:
            raw["subresource"] = e.subresource
        out.append(raw)
    return out


def store(obj: dict[str, Any], entries: Entries) -> None:
    md = obj.setdefault("metadata", {})
    encoded = encode(entries)
    if encoded:
        md["managedFields"] = encoded
    else:
        md.pop("managedFields", None)


def current(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> Entries:
    """The entries a write starts from: the stored ones, unless the request sets others itself
    (a non-empty list that differs replaces them; ``[{}]`` clears them; ``[]`` or none keeps them)."""
    given = strategies.meta(new).get("managedFields")
    stored = strategies.meta(old).get("managedFields") if old else None
    if given and given != stored:
        return decode(given)
    return decode(stored)


def track_update(shape: Shape, old: Mapping[str, Any] | None, new: dict[str, Any], manager: str,
                 api_version: str, *, has_status: bool, subresource: str | None = None) -> None:
    """Record a create, update or patch by ``manager`` in ``new``'s managedFields (operation Update)."""
    entries = current(old, new)
    skip = ignored(has_status, subresource)
    diff = compare(_bare(old) if old else {}, _bare(new), shape)
    changed = without(diff.changed, skip)
    removed = without(diff.removed, skip)
    if changed or removed:
        for entry in entries.values():
            entry.paths -= changed | removed
    if changed:
        mine = Entry(manager, UPDATE, api_version, set(), None, subresource or "")
        mine = entries.setdefault(mine.identity, mine)
        mine.paths |= changed
        mine.time = strategies.now()
    store(new, entries)


def _bare(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object without its managedFields (a shallow copy: the walks only read)."""
    out = dict(obj)
    md = dict(strategies.meta(obj))
    md.pop("managedFields", None)
    out["metadata"] = md
    return out


def manager_of(params: Mapping[str, str], user_agent: str | None) -> str:
    """``fieldManager``, else the User-Agent's product (``kubectl/v1.32 ...`` -> ``kubectl``), as the
    real server names an updater; at most 128 characters."""
    name = params.get("fieldManager") or (user_agent or "unknown").split("/")[0]
    return name[:128]
