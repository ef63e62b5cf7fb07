"""The condition lists of a SharedDeviceGroup's status, as the operator edits them.

One condition set, or removed, in the list the status already has: ``lastTransitionTime`` moves only when the
condition's status changes (as the API conventions ask), and two lists compare equal when they differ only there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from deviceshare.api import models

from .storage import now_rfc3339


def wire_conditions(conditions: Iterable[models.Condition]) -> list[dict[str, Any]]:
    return [c.to_k8s() for c in conditions]


def condition(
    existing: Sequence[Mapping[str, Any]],
    type_: str,
    status: str,
    reason: str,
    message: str,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """The full condition list with ``type_`` set; lastTransitionTime moves only when status changes."""
    out: list[dict[str, Any]] = []
    found = False
    for c in existing:
        if c.get("type") != type_:
            out.append(dict(c))
            continue
        found = True
        kept = c.get("lastTransitionTime") if c.get("status") == status else None
        out.append(_cond(type_, status, reason, message, kept or now_rfc3339(), generation))
    if not found:
        out.append(_cond(type_, status, reason, message, now_rfc3339(), generation))
    return out


def without_condition(existing: Sequence[Mapping[str, Any]], type_: str) -> list[dict[str, Any]]:
    return [dict(c) for c in existing if c.get("type") != type_]


def _cond(
    type_: str, status: str, reason: str, message: str, ltt: str, generation: int | None
) -> dict[str, Any]:
    c: dict[str, Any] = {
        "type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": ltt,
    }
    if generation is not None:
        c["observedGeneration"] = generation
    return c


def same_conditions(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> bool:
    """Equal but for lastTransitionTime (which :func:`condition` keeps stable anyway)."""
    def key(c: Mapping[str, Any]) -> tuple[Any, ...]:
        return (c.get("type"), c.get("status"), c.get("reason"), c.get("message"), c.get("observedGeneration"))

    return sorted(map(key, a)) == sorted(map(key, b))
