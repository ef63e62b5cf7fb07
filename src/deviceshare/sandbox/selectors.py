"""Label and field selectors, parsed from query strings or LabelSelector objects.

The grammar is kube-apiserver's: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``,
``a``, ``!a`` for labels; ``f=v``, ``f==v``, ``f!=v`` for fields, only on fields the resource
declares selectable (anything else is a 400, as on a real cluster).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from deviceshare.sandbox import errors

_REQUIREMENT = re.compile(
    r"\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9._/-]+)\s*"
    r"(?:(?P<op>==|!=|=|\s+in\s+|\s+notin\s+)\s*(?P<value>\([^)]*\)|[A-Za-z0-9._-]*))?\s*"
)


@dataclasses.dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op == "in":
            return self.key in labels and labels[self.key] in self.values
        # notin and != match objects without the label, as on a real cluster
        return self.key not in labels or labels[self.key] not in self.values


@dataclasses.dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        found = labels or {}
        return all(r.matches(found) for r in self.requirements)


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def parse_labels(text: str | None) -> LabelSelector:
    if not text:
        return LabelSelector()
    reqs = []
    for part in _split_top_level(text):
        m = _REQUIREMENT.fullmatch(part)
        if not m:
            raise errors.bad_request(f"unable to parse requirement: {part!r}")
        key, op, value = m["key"], (m["op"] or "").strip(), m["value"]
        if m["neg"]:
            if op:
                raise errors.bad_request(f"unable to parse requirement: {part!r}")
            reqs.append(Requirement(key, "!exists"))
        elif not op:
            reqs.append(Requirement(key, "exists"))
        elif op in ("in", "notin"):
            if not value or not value.startswith("("):
                raise errors.bad_request(f"unable to parse requirement: {part!r}: expected (values)")
            values = frozenset(v.strip() for v in value[1:-1].split(",") if v.strip())
            reqs.append(Requirement(key, op, values))
        else:
            reqs.append(Requirement(key, "notin" if op == "!=" else "in", frozenset({value or ""})))
    return LabelSelector(tuple(reqs))


def from_object(selector: Mapping[str, Any] | None) -> LabelSelector:
    """A ``metav1.LabelSelector`` (matchLabels + matchExpressions); None or {} selects everything."""
    if not selector:
        return LabelSelector()
    reqs = [Requirement(k, "in", frozenset({str(v)})) for k, v in (selector.get("matchLabels") or {}).items()]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}
    for expr in selector.get("matchExpressions") or []:
        op = ops.get(expr.get("operator", ""))
        if op is None:
            raise errors.bad_request(f"{expr.get('operator')!r} is not a valid label selector operator")
        reqs.append(Requirement(expr["key"], op, frozenset(expr.get("values") or ())))
    return LabelSelector(tuple(reqs))


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string form a field selector compares against: missing is "", booleans lower-case."""
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            node = None
            break
        node = node[part]
    if node is None:
        return "false" if path == "spec.unschedulable" else ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


@dataclasses.dataclass(frozen=True)
class FieldSelector:
    terms: tuple[tuple[str, bool, str], ...] = ()  # (field, equal?, value)

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all((field_value(obj, f) == v) == eq for f, eq, v in self.terms)

    def name(self) -> str | None:
        """The object name when the selector pins one (kubectl's watch of a single object)."""
        for field, eq, value in self.terms:
            if field == "metadata.name" and eq:
                return value
        return None


def parse_fields(text: str | None, selectable: Any = None) -> FieldSelector:
    """Parse; ``selectable(field) -> bool`` rejects unsupported fields with 400 like the real API."""
    if not text:
        return FieldSelector()
    terms = []
    for part in text.split(","):
        if not part.strip():
            continue
        m = re.fullmatch(r"\s*([A-Za-z0-9._\[\]/-]+)\s*(==|!=|=)\s*(.*?)\s*", part)
        if not m:
            raise errors.bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        field, op, value = m.groups()
        if selectable is not None and not selectable(field):
            raise errors.bad_request(f"field label not supported: {field}")
        terms.append((field, op != "!=", value))
    return FieldSelector(tuple(terms))
