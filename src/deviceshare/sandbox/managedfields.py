"""Field ownership as kube-apiserver records it: ``metadata.managedFields``.

Each object keeps one entry per manager: ``manager``, ``operation`` (Apply or Update), ``apiVersion``,
``time``, ``subresource`` and ``fieldsV1``, the set of fields it owns (``fieldsets``). This module reads
and writes those entries and does what every create, update and patch does to them
(:func:`track_update`: operation Update, the writer takes the fields it changed from everyone else);
apply itself is in ``applying``. Writes the sandbox makes in-process (its kubelet, Deployment
controller, test conveniences) record no ownership, and the binding subresource records none (as on
kube-apiserver).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from deviceshare.sandbox import strategies
from deviceshare.sandbox.fieldsets import Path, compare, from_fields_v1, list_elements, to_fields_v1, without
from deviceshare.sandbox.fieldshapes import ATOMIC, Shape

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


def ignored(has_status: bool, subresource: str | None) -> tuple[Path, ...]:
    """What a write to the main resource or a subresource never owns (the strategy's reset fields)."""
    if subresource == "status":
        return (*STRIPPED, ("f:spec",))
    return (*STRIPPED, ("f:status",)) if has_status else STRIPPED


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


def _entry(raw: Mapping[str, Any]) -> Entry:
    return Entry(str(raw["manager"]), str(raw.get("operation", UPDATE)), str(raw.get("apiVersion", "")),
                 from_fields_v1(raw.get("fieldsV1") or {}), raw.get("time"), str(raw.get("subresource", "")))


def _raw(e: Entry) -> dict[str, Any]:
    raw: dict[str, Any] = {"manager": e.manager, "operation": e.operation, "apiVersion": e.api_version}
    if e.time:
        raw["time"] = e.time
    raw.update(fieldsType="FieldsV1", fieldsV1=to_fields_v1(e.paths))
    if e.subresource:
        raw["subresource"] = e.subresource
    return raw


def _identity(raw: Mapping[str, Any]) -> tuple[str, str, str, str]:
    operation = str(raw.get("operation", UPDATE))
    return (str(raw["manager"]), operation, str(raw.get("subresource", "")),
            str(raw.get("apiVersion", "")) if operation == UPDATE else "")


def _order(raw: Mapping[str, Any]) -> tuple[str, ...]:
    """How entries are stored: Apply before Update, then by time, manager, version, subresource."""
    return tuple(str(raw.get(k) or "") for k in ("operation", "time", "manager", "apiVersion", "subresource"))


def decode(managed: Any) -> Entries:
    entries: Entries = {}
    for raw in managed or []:
        if isinstance(raw, Mapping) and raw.get("manager"):
            entry = _entry(raw)
            entries[entry.identity] = entry
    return entries


def encode(entries: Entries) -> list[dict[str, Any]]:
    return sorted((_raw(e) for e in entries.values() if e.paths), key=_order)


def store(obj: dict[str, Any], entries: Entries) -> None:
    md = obj.setdefault("metadata", {})
    encoded = encode(entries)
    if encoded:
        md["managedFields"] = encoded
    else:
        md.pop("managedFields", None)


def _starting(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[Any]:
    """The entries a write starts from: the stored ones, unless the request sets others itself
    (a non-empty list that differs replaces them; ``[{}]`` clears them; ``[]`` or none keeps them)."""
    given = strategies.meta(new).get("managedFields")
    stored = strategies.meta(old).get("managedFields") if old else None
    return list((given if given and given != stored else stored) or [])


def current(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> Entries:
    return decode(_starting(old, new))


def _owns(trie: Mapping[str, Any], path: Path) -> bool:
    node: Any = trie
    for element in path:
        node = node.get(element)
        if node is None:
            return False
    return not node or "." in node


def track_update(shape: Shape, old: Mapping[str, Any] | None, new: dict[str, Any], manager: str,
                 api_version: str, *, has_status: bool, subresource: str | None = None) -> None:
    """Record a create, update or patch by ``manager`` in ``new``'s managedFields (operation Update).

    Entries the write does not touch are kept as stored (looked up in their fieldsV1, not decoded): the
    operator's status writes, mostly to fields it owns already, only move its entry's time."""
    skip = ignored(has_status, subresource)
    if old is None and not strategies.meta(new).get("managedFields"):  # a create: the writer owns all of it
        trie = created_fields_v1(new, shape, skip)
        mine = Entry(manager, UPDATE, api_version, set(), strategies.now(), subresource or "")
        if trie:
            new["metadata"]["managedFields"] = [{**_raw(mine), "fieldsV1": trie}]
        return
    diff = compare(bare(old) if old else {}, bare(new), shape)
    changed, removed = without(diff.changed, skip), without(diff.removed, skip)
    touched = changed | removed
    mine_identity = Entry(manager, UPDATE, api_version, set(), None, subresource or "").identity
    out, found = [], False
    for raw in _starting(old, new):
        if not isinstance(raw, Mapping) or not raw.get("manager"):
            continue
        trie = raw.get("fieldsV1") or {}
        if _identity(raw) == mine_identity:
            found = True
            if not any(_owns(trie, p) for p in removed) and all(_owns(trie, p) for p in changed):
                out.append({**raw, "time": strategies.now()} if changed else raw)
                continue
            entry = _entry(raw)
            entry.paths = (entry.paths - removed) | changed
            entry.time = strategies.now() if changed else entry.time
            out.append(_raw(entry))
        elif not any(_owns(trie, p) for p in touched):
            out.append(raw)
        else:
            entry = _entry(raw)
            entry.paths -= touched
            if entry.paths:
                out.append(_raw(entry))
    if changed and not found:
        out.append(_raw(Entry(manager, UPDATE, api_version, changed, strategies.now(), subresource or "")))
    md = new.setdefault("metadata", {})
    if out:
        md["managedFields"] = sorted(out, key=_order)
    else:
        md.pop("managedFields", None)


def created_fields_v1(obj: Mapping[str, Any], shape: Shape, skip: Sequence[Path]) -> dict[str, Any]:
    """What ``to_fields_v1(without(compare({}, obj, shape).changed, skip))`` gives, in one walk of ``obj``:
    every write is tracked, and creates (pods, events) are the most frequent ones."""
    cut = set(skip)
    lengths = {len(c) for c in cut}

    def walk(value: Any, node_shape: Shape, path: Path) -> dict[str, Any] | None:
        children: dict[str, Any] = {}
        if isinstance(value, dict) and value and not node_shape.atomic_map:
            items = [(f"f:{k}", v, node_shape.child(k)[0]) for k, v in value.items()]
        elif isinstance(value, list) and value:
            kind, elements = list_elements(node_shape, value)
            if kind == ATOMIC:
                return {}
            item = node_shape.item()
            items = [(e, v, item) for e, v in zip(elements, value, strict=True)]
        else:
            return {}  # a leaf: a scalar, an empty map or list, an atomic map
        for element, child_value, child_shape in items:
            p = (*path, element)
            if any(p[:n] in cut for n in lengths):
                continue
            found = walk(child_value, child_shape, p)
            if found is not None:
                children[element] = found
        if not children:
            return None  # everything under it is someone else's concern (stripped)
        ordered = {k: children[k] for k in sorted(children)}
        return {".": {}, **ordered} if path and path != ("f:metadata",) else ordered

    return walk(bare(obj), shape, ()) or {}


def bare(obj: Mapping[str, Any]) -> dict[str, Any]:
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
