"""Pure builders of what the operator writes: group status bodies, conditions and pod annotations."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from deviceshare.api import envnames, models, names
from deviceshare.core import members as member_rules

from . import state as state_
from .storage import now_rfc3339


def device_annotations(
    devices: Mapping[str, Sequence[str]], env_names: envnames.EnvNames
) -> dict[str, str]:
    """The annotations a member pod carries: selected devices, and one value per visibility env var."""
    selected = {r: ",".join(ids) for r, ids in sorted(devices.items())}
    out = {names.POD_SELECTED_DEVICES_ANNOTATION: json.dumps(selected, separators=(",", ":"))}
    per_env: dict[str, list[str]] = {}
    for resource, ids in sorted(devices.items()):
        for env in env_names.for_resource(resource):
            per_env.setdefault(env, []).extend(ids)
    for env, ids in per_env.items():
        out[names.env_annotation(env)] = ",".join(ids)
    return out


def describe_devices(devices: Mapping[str, Sequence[str]]) -> str:
    return "; ".join(f"{r} {','.join(ids)}" for r, ids in sorted(devices.items()))


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
