"""A namespace's device budget: its ResourceQuota's ``requests.<device resource>`` counts groups too.

Group pods may not request devices (the device plugin would allocate them twice), so the API server's
quota admission never sees what a group holds. The budget closes that gap the way a cluster admin
expects: the ``hard`` limit a ResourceQuota sets on ``requests.nvidia.com/gpu`` caps the devices of
the namespace's groups plus what its pods request directly (the quota's ``status.used``). Every
group counts all of ``spec.resources`` from its creation until it is gone, whatever its phase, and
a sharing group counts its devices too: a quota is a promise about capacity taken, and a Pending
group is about to take it.

Only quotas without ``scopes``/``scopeSelector`` apply (a scope selects pods by a property a group
does not have). A change that does not raise a group's count is never refused, as quota admission
lets objects that take no more through even when the namespace is over its limit.

Pure: the webhook checks a group's CREATE/UPDATE with it, and the operator can check again when it
places a group (the authoritative point: two groups admitted at once both pass the webhook).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from deviceshare.core import inventory

QUOTA_PREFIX = "requests."


@dataclasses.dataclass(frozen=True)
class Quota:
    """One ResourceQuota, reduced to its device limits."""

    name: str
    hard: Mapping[str, int]  # device resource -> devices
    used: Mapping[str, int] = dataclasses.field(default_factory=dict)  # by pods, per status.used


@dataclasses.dataclass(frozen=True)
class OverBudget:
    """Why a group does not fit its namespace's budget."""

    namespace: str
    group: str
    quota: str
    resource: str
    hard: int
    used_by_pods: int
    held_by_groups: int  # by the namespace's other groups
    requested: int  # by this group

    @property
    def message(self) -> str:
        parts = [f"other groups hold {self.held_by_groups}"]
        if self.used_by_pods:
            parts.append(f"pods request {self.used_by_pods}")
        return (
            f"SharedDeviceGroup {self.group!r} asks for {self.requested} {self.resource}, which exceeds "
            f"ResourceQuota {self.quota!r} in namespace {self.namespace!r}: "
            f"{QUOTA_PREFIX}{self.resource} is {self.hard} and {', '.join(parts)}"
        )


def quota_from_object(obj: Mapping[str, Any]) -> Quota | None:
    """The device limits of a ResourceQuota object; ``None`` if it has none or is scoped."""
    spec = obj.get("spec") or {}
    if spec.get("scopes") or spec.get("scopeSelector"):
        return None
    hard = _devices(spec.get("hard"))
    if not hard:
        return None
    used = _devices((obj.get("status") or {}).get("used"))
    return Quota(str((obj.get("metadata") or {}).get("name") or ""), hard, used)


def _devices(values: object) -> dict[str, int]:
    out: dict[str, int] = {}
    if not isinstance(values, Mapping):
        return out
    for key, quantity in values.items():
        resource = str(key)[len(QUOTA_PREFIX):] if str(key).startswith(QUOTA_PREFIX) else ""
        if not inventory.is_device_resource(resource):
            continue
        try:
            out[resource] = inventory.parse_memory(quantity)  # a count, rounded up like any quantity
        except (ValueError, TypeError):
            continue  # the API server validates quotas; an unreadable one limits nothing here
    return out


def over_budget(
    namespace: str,
    group: str,
    resources: Mapping[str, int],
    others: Iterable[Mapping[str, int]],
    quotas: Iterable[Quota],
    previous: Mapping[str, int] | None = None,
) -> OverBudget | None:
    """The first quota ``group`` (asking for ``resources``) would break, given the namespace's
    ``others`` groups (their ``spec.resources``, not including this group), or ``None``.

    ``previous`` is the group's resources before an update: a resource it does not raise is not
    checked.
    """
    held: dict[str, int] = {}
    for other in others:
        for resource, count in other.items():
            held[resource] = held.get(resource, 0) + count
    for quota in sorted(quotas, key=lambda q: q.name):
        for resource, hard in sorted(quota.hard.items()):
            wanted = resources.get(resource, 0)
            if not wanted or (previous is not None and wanted <= previous.get(resource, 0)):
                continue
            pods = quota.used.get(resource, 0)
            if pods + held.get(resource, 0) + wanted > hard:
                return OverBudget(namespace, group, quota.name, resource, hard, pods, held.get(resource, 0), wanted)
    return None
