"""The groups that hold nothing and wait, with why: what ``deviceshare inspect`` shows below the device map.

A gang short of members (``WaitingForMembers``, ``2/3 member pods exist``), a gang no node fits as a whole, a group
a preemption makes room for (``Preempting``, its ``nominatedNodeName``), one that was preempted or whose node was
lost: each is read from the group's ``Scheduled`` condition, as the operator wrote it (CONTRACT §8).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from deviceshare.api import names


@dataclass(frozen=True)
class Waiting:
    namespace: str
    name: str
    reason: str
    message: str
    nominated: str | None = None

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def waiting(groups: Sequence[Mapping[str, Any]]) -> list[Waiting]:
    """Groups not Bound, with their ``Scheduled`` condition's reason and message, and deleted groups waiting for
    their member pods to go (a Releasing group's condition still says Bound), sorted by name."""
    out: list[Waiting] = []
    for group in groups:
        meta, status = group.get("metadata") or {}, group.get("status") or {}
        if meta.get("deletionTimestamp"):
            members = list(status.get("members") or [])
            out.append(Waiting(str(meta.get("namespace", "")), str(meta.get("name", "")), "Deleting",
                               f"keeps its devices until its member pods are gone ({', '.join(members)}); "
                               "delete them or let them finish" if members else
                               "releases its devices once the operator sees no member pod on them"))
            continue
        if status.get("phase") == names.PHASE_BOUND:
            continue
        conditions: list[Mapping[str, Any]] = status.get("conditions") or []
        scheduled = next((c for c in conditions if c.get("type") == names.CONDITION_SCHEDULED), {})
        out.append(Waiting(str(meta.get("namespace", "")), str(meta.get("name", "")),
                           str(scheduled.get("reason") or "-"), str(scheduled.get("message") or ""),
                           status.get("nominatedNodeName") or None))
    return sorted(out, key=lambda w: (w.namespace, w.name))


def to_json(rows: Sequence[Waiting]) -> list[dict[str, Any]]:
    return [{"namespace": w.namespace, "name": w.name, "reason": w.reason, "message": w.message,
             **({"nominatedNodeName": w.nominated} if w.nominated else {})} for w in rows]


def render(rows: Sequence[Waiting], out: TextIO) -> None:
    if not rows:
        return
    out.write("\nWaiting groups:\n")
    for w in rows:
        nominated = f" [nominated: {w.nominated}]" if w.nominated else ""
        out.write(f"  {w.ref}: {w.reason}{nominated}: {w.message}\n")
