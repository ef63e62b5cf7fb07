"""A namespace's device budget: its ResourceQuota's ``requests.<device resource>`` counts groups too.

Group pods may not request devices (the device plugin would allocate them twice), so the API server's
quota admission never sees what a group holds. The budget closes that gap the way a cluster admin
expects: the ``hard`` limit a ResourceQuota sets on ``requests.nvidia.com/gpu`` caps the devices of
the namespace's groups plus what its pods request directly (the quota's ``status.used``). Every
group counts all of ``spec.resources`` from its creation until it is gone, whatever its phase, and
a sharing group counts its devices too: a quota is a promise about capacity taken, and a Pending
group is about to take it.

A DRA group (CONTRACT §13) counts as kube-apiserver counts its ResourceClaim (``<group>-devices``, one
request ``exactly: {deviceClassName, allocationMode: ExactCount, count}``): quota admission's evaluator
(kubernetes pkg/quota/v1/evaluator/core/resource_claims.go, ``Usage``) charges every claim 1 of
``count/resourceclaims.resource.k8s.io`` and ``count`` of ``<class>.deviceclass.resource.k8s.io/devices``
(``All`` as 32, a ``firstAvailable`` list as its largest alternative per class; not used here), admin
access included, whatever the claim's capacity requests; with the DRAExtendedResource gate also
``requests.deviceclass.resource.kubernetes.io/<class>`` and ``requests.<the class's extendedResourceName>``
(not counted here: they need the class's mapping). So the budget reads ``<class>.deviceclass.resource.k8s.io/devices``
limits, keyed by the class name (a DeviceClass name has no ``/``, an extended resource always has one).
Unlike a pod's ``requests.nvidia.com/gpu``, its ``status.used`` already counts the groups' own claims (the
operator makes a group's claim as soon as it sees the group): the namespace's claims of a class then take
the larger of what ``status.used`` counts (every claim, without the group's own) and what the other groups
ask together (their claims, made or about to be), never both added. A claim kube-apiserver admitted is what
it counted: its own quota admission, when the operator creates the claim, is the last word.

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
CLAIM_QUOTA_SUFFIX = ".deviceclass.resource.k8s.io/devices"  # corev1.ResourceClaimsPerClass


def is_device_class(resource: str) -> bool:
    """A DRA group's budget key (its DeviceClass: a DNS subdomain, no ``/``), not an extended resource's."""
    return "/" not in resource


def quota_name(resource: str) -> str:
    """The ResourceQuota entry that limits ``resource``: ``requests.nvidia.com/gpu``, or for a DeviceClass
    ``gpu.nvidia.com.deviceclass.resource.k8s.io/devices``."""
    return f"{resource}{CLAIM_QUOTA_SUFFIX}" if is_device_class(resource) else f"{QUOTA_PREFIX}{resource}"


ALL_DEVICES = 32  # resourceapi.AllocationResultsMaxSize: what a claim's allocationMode All is charged


def claim_devices(claim: Mapping[str, Any], device_class: str) -> int:
    """What quota admission charged a ResourceClaim on ``<device_class>.deviceclass.resource.k8s.io/devices`` (the
    evaluator's ``Usage``: an ExactCount request its count, All 32, a ``firstAvailable`` list its largest
    alternative of the class)."""
    devices = 0
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
        alternatives = request.get("firstAvailable") or ([request["exactly"]] if request.get("exactly") else [])
        most = 0
        for sub in alternatives:
            if sub.get("deviceClassName") != device_class:
                continue
            mode = sub.get("allocationMode") or "ExactCount"
            charged = int(sub.get("count") or 1) if mode == "ExactCount" else ALL_DEVICES if mode == "All" else 0
            most = max(most, charged)
        devices += most
    return devices


@dataclasses.dataclass(frozen=True)
class Quota:
    """One ResourceQuota, reduced to its device limits."""

    name: str
    hard: Mapping[str, int]  # device resource or DeviceClass -> devices
    # per status.used: by pods for a device resource; by every ResourceClaim (the groups' own too) for a class
    used: Mapping[str, int] = dataclasses.field(default_factory=dict)


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
    used_by_claims: int | None = None  # a DeviceClass: what the namespace's other ResourceClaims take

    @property
    def message(self) -> str:
        if self.used_by_claims is not None:
            return (
                f"SharedDeviceGroup {self.group!r} asks for {self.requested} {self.resource}, which exceeds "
                f"ResourceQuota {self.quota!r} in namespace {self.namespace!r}: {quota_name(self.resource)} is "
                f"{self.hard} and ResourceClaims take {self.used_by_claims} (other groups' claims ask for "
                f"{self.held_by_groups})"
            )
        parts = [f"other groups hold {self.held_by_groups}"]
        if self.used_by_pods:
            parts.append(f"pods request {self.used_by_pods}")
        return (
            f"SharedDeviceGroup {self.group!r} asks for {self.requested} {self.resource}, which exceeds "
            f"ResourceQuota {self.quota!r} in namespace {self.namespace!r}: "
            f"{quota_name(self.resource)} is {self.hard} and {', '.join(parts)}"
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
        name = str(key)
        if name.endswith(CLAIM_QUOTA_SUFFIX):
            resource = name[: -len(CLAIM_QUOTA_SUFFIX)]
            if not resource or not is_device_class(resource):
                continue
        else:
            resource = name[len(QUOTA_PREFIX):] if name.startswith(QUOTA_PREFIX) else ""
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
    counted: Mapping[str, int] | None = None,
) -> OverBudget | None:
    """The first quota ``group`` (asking for ``resources``) would break, given the namespace's
    ``others`` groups (what they ask, not including this group), or ``None``.

    ``previous`` is the group's resources before an update: a resource it does not raise is not
    checked. ``counted``: what the quotas' ``status.used`` may already count of this group's own
    ResourceClaim (a DRA group's, see the module docstring): nothing for a group being created, its
    previous request for an update, what quota admission charged its claim if that exists (the
    operator's check, :func:`claim_devices`).
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
            used, others_ask = quota.used.get(resource, 0), held.get(resource, 0)
            if is_device_class(resource):  # status.used counts ResourceClaims, the groups' own among them
                claims = max(used - (counted or {}).get(resource, 0), others_ask, 0)
                if claims + wanted > hard:
                    return OverBudget(namespace, group, quota.name, resource, hard, 0, others_ask, wanted, claims)
            elif used + others_ask + wanted > hard:
                return OverBudget(namespace, group, quota.name, resource, hard, used, others_ask, wanted)
    return None
