"""A namespace's device budget, checked where it is decided: when the operator places a group.

The webhook refuses a group CREATE that would break its namespace's ResourceQuota, but it answers from a
cache, so two groups created together both pass it (and a cluster may run without it). Placement is the
authoritative point: a group is placed only if the devices the namespace's other groups hold, by the
ledger (our own records, never anything a tenant wrote), plus what it asks for fit every quota. The
arithmetic is :func:`deviceshare.core.budget.over_budget`, the webhook's own. A DRA group (CONTRACT §13) counts as
kube-apiserver counts its ResourceClaim, on ``<class>.deviceclass.resource.k8s.io/devices``: its claim (made when
the group was seen) may already be in the quota's ``status.used``, and is not counted twice. A group whose claim
the API server refused for its quota is thus not placed either: no devices held for a claim that cannot exist.

The quotas come from a :class:`QuotaCache` that a reflector keeps (a list+watch of every ResourceQuota:
they are few, and a read per placed group visibly slowed binding in ``bench_operator_writes --quick``);
until its first list has arrived, a placement reads its namespace's quotas with one GET instead. The
check itself runs with no ``await`` between it and the reservation in the ledger, so two groups of one
namespace placed at the same moment cannot both pass it: the race the budget must close is between
groups, and the ledger decides it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deviceshare.api import names
from deviceshare.core import budget
from deviceshare.core import ledger as ledgers

from . import storage

GroupKey = tuple[str, str]


class QuotaCache:
    """Device quotas by namespace, mirrored by a reflector (a :class:`deviceshare.kube.watching.Sink`)."""

    def __init__(self) -> None:
        self.synced = False
        self._by_key: dict[tuple[str, str], budget.Quota] = {}

    def replace(self, objects: list[Mapping[str, Any]], resource_version: str | None = None) -> None:
        self._by_key.clear()
        for obj in objects:
            self.apply("ADDED", obj)
        self.synced = True

    def apply(self, event_type: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        quota = None if event_type == "DELETED" else budget.quota_from_object(obj)
        if quota is None:
            self._by_key.pop(key, None)  # deleted, or (no longer) limits any device
        else:
            self._by_key[key] = quota

    def quotas(self, namespace: str) -> list[budget.Quota]:
        return [q for (ns, _), q in self._by_key.items() if ns == namespace]


async def read(cache: QuotaCache, api: storage.ClusterApi, namespace: str) -> list[budget.Quota]:
    """The namespace's quotas that limit devices (unscoped, with a ``requests.<device>`` entry)."""
    if cache.synced:
        return cache.quotas(namespace)
    quotas = (budget.quota_from_object(obj) for obj in await api.list_resource_quotas(namespace))
    return [q for q in quotas if q is not None]


async def own_claim_counted(
    api: storage.ClusterApi, gkey: GroupKey, device_class: str | None, quotas: list[budget.Quota]
) -> dict[str, int]:
    """What the quotas' ``status.used`` already counts of the group's own ResourceClaim (``<group>-devices``, a DRA
    group's): its devices of ``device_class`` once the claim exists (quota admission charged it when it was made);
    nothing while it does not (not made yet, or refused for the quota): those devices are still to be charged, and
    subtracting them would let a group be placed whose claim kube-apiserver refuses. Read only where a quota limits
    the class."""
    if device_class is None or not any(device_class in q.hard for q in quotas):
        return {}
    claim = await api.read_claim((gkey[0], names.claim_name(gkey[1])))
    return {} if claim is None else {device_class: budget.claim_devices(claim, device_class)}


def refusal(
    ledger: ledgers.DeviceLedger, gkey: GroupKey, resources: Mapping[str, int], quotas: list[budget.Quota],
    counted: Mapping[str, int] | None = None,
) -> str | None:
    """Why placing ``gkey`` (asking for ``resources``) would break a quota of its namespace, or ``None``.
    ``counted``: what ``status.used`` already counts of the group's own claim (:func:`own_claim_counted`)."""
    if not quotas:
        return None
    namespace, name = gkey
    held = [
        {resource: len(ids) for resource, ids in a.devices.items()}
        for a in ledger.allocations()
        if a.group[0] == namespace and a.group != gkey
    ]
    over = budget.over_budget(namespace, name, resources, held, quotas, counted=counted)
    if over is None:
        return None
    allows = f'ResourceQuota "{over.quota}" allows {budget.quota_name(over.resource)} {over.hard}'
    if over.used_by_claims is not None:
        return (f'SharedDeviceGroup "{name}" would put namespace {namespace} over its device budget: {allows}, '
                f"ResourceClaims take {over.used_by_claims}, this group's claim asks for {over.requested}")
    pods = f", pods request {over.used_by_pods}" if over.used_by_pods else ""
    return (
        f'SharedDeviceGroup "{name}" would put namespace {namespace} over its device budget: {allows}, '
        f"groups hold {over.held_by_groups}{pods}, this group needs {over.requested}"
    )
