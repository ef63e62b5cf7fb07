"""Pure builders of what the operator writes: group status bodies, conditions and pod annotations."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from deviceshare.api import envnames, models, podannotations
from deviceshare.core import inventory
from deviceshare.core import ledger as ledgers
from deviceshare.core import members as member_rules

from . import state as state_
from .storage import now_rfc3339


def device_annotations(
    devices: Mapping[str, Sequence[str]],
    env_names: envnames.EnvNames,
    share: Mapping[str, podannotations.ShareAmounts] | None = None,
    tiles: Mapping[str, Sequence[str]] | None = None,
    node_devices: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, str]:
    """The annotations a member pod carries; see :func:`deviceshare.api.podannotations.member_annotations`."""
    return podannotations.member_annotations(devices, env_names, share, tiles, node_devices)


def allocation_annotations(
    allocation: ledgers.Allocation, env_names: envnames.EnvNames, node: inventory.NodeInfo | None
) -> dict[str, str]:
    """A member's annotations for its group's allocation, shares and tiles included (CONTRACT §7)."""
    return podannotations.member_annotations(
        allocation.devices, env_names, allocation.share, allocation.tiles, node.devices if node else None
    )


def allocated_fields(allocation: ledgers.Allocation | None) -> dict[str, Any]:
    """``allocatedDevices`` and ``allocatedTiles`` of a group's status (None removes them)."""
    if allocation is None:
        return {"allocatedDevices": None, "allocatedTiles": None}
    return {
        "allocatedDevices": {r: list(ids) for r, ids in sorted(allocation.devices.items())},
        "allocatedTiles": {r: list(ids) for r, ids in sorted(allocation.tiles.items())} or None,
    }


def describe_devices(devices: Mapping[str, Sequence[str]]) -> str:
    return "; ".join(f"{r} {','.join(ids)}" for r, ids in sorted(devices.items()))


def describe_allocation(allocation: ledgers.Allocation) -> str:
    """``nvidia.com/gpu 0,1``, or with a share ``nvidia.com/gpu 0 (compute=460m,memory=12Gi)``, tiles named."""
    out = []
    for resource, ids in sorted(allocation.devices.items()):
        share = allocation.share.get(resource)
        text = f"{resource} {','.join(ids)}"
        if share is not None:
            tiles = allocation.tiles.get(resource)
            text += f" ({share.describe()}{': ' + ','.join(tiles) if tiles else ''})"
        out.append(text)
    return "; ".join(out)


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


def listed_members(
    pods: Iterable[state_.PodRecord], spec: models.GroupSpec | None, env_names: envnames.EnvNames
) -> list[state_.PodRecord]:
    """The pods a group's status lists as members: those we bound into it, and pending ones that pass the
    member rules the webhook applies. A pod the pre-bind check refuses (it joined after admission with the
    group's device resource or visibility env var) is no member, however its annotation names the group."""
    if spec is None:
        return [p for p in pods if p.member_of is not None]
    env = member_rules.visibility_env(spec.resources, env_names)
    return [
        p for p in pods
        if p.member_of is not None or next(member_rules.conflicts(p.containers, spec.resources, env), None) is None
    ]
