"""What `inspect` and `explain` read of Dynamic Resource Allocation (CONTRACT §13): the ResourceSlices,
DeviceClasses and ResourceClaims, folded into each node's devices by the operator's own inventory
(:class:`deviceshare.operator.drainventory.DraInventory`), so the CLI shows exactly what the operator offers:

- a node's DRA devices under their DeviceClass, IDs ``<pool>/<device>`` (as the groups' ``allocatedDevices``);
- the extended resource the class replaces (``extendedResourceName``, e.g. ``nvidia.com/gpu``) gone from a node
  with slices of that class: the operator does not offer those GPUs twice;
- a device tainted ``NoSchedule``/``NoExecute`` marked tainted, and one in the allocation of a claim that is not a
  group's own (kube-scheduler's, a tenant's) marked as held by that claim.

Which claim is "ours" is the operator's rule too (a group owns it, it is named ``<group>-devices`` and holds exactly
the devices the group holds); here what a group holds is its ``status.allocatedDevices``, the truth a user can read.

The CLI runs as the user: a kind it may not read (403) is named in one line and the rest is shown; a cluster that
does not serve ``resource.k8s.io/v1`` (404) has no DRA devices.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from deviceshare.api import names
from deviceshare.core import inventory
from deviceshare.operator import drainventory

if TYPE_CHECKING:
    from kubernetes_asyncio import client as k8s

KINDS = ("resourceslices", "deviceclasses", "resourceclaims")


@dataclasses.dataclass(frozen=True)
class DraObjects:
    """The DRA objects as listed; ``forbidden``: the kinds the user may not list (403)."""

    slices: Sequence[Mapping[str, Any]] = ()
    classes: Sequence[Mapping[str, Any]] = ()
    claims: Sequence[Mapping[str, Any]] = ()
    forbidden: tuple[str, ...] = ()

    def note(self) -> str | None:
        """One line saying what could not be read and what that leaves out; None when everything was read."""
        if not self.forbidden:
            return None
        return (f"Not allowed to list {', '.join(self.forbidden)} ({names.DRA_API_VERSION}, 403 Forbidden): "
                "DRA devices, their taints or other claims' allocations may be missing below, and a node's "
                "extended resource may show free although DRA devices replace it.")


async def read(api: k8s.ApiClient) -> DraObjects:
    from deviceshare.cli import inspect as inspect_
    from deviceshare.kube import rest

    async def items(kind: str) -> list[Mapping[str, Any]] | None:
        try:
            found = await inspect_.get_json(api, f"/apis/{names.DRA_API_VERSION}/{kind}")
        except rest.ApiError as e:
            if e.status == 404:  # no DRA API on this cluster
                return []
            if e.status == 403:
                return None
            raise
        return list(found.get("items") or [])

    slices, classes, claims = await asyncio.gather(*(items(k) for k in KINDS))
    return DraObjects(slices or [], classes or [], claims or [],
                      tuple(k for k, got in zip(KINDS, (slices, classes, claims), strict=True) if got is None))


class Folded:
    """The operator's DRA inventory over what was read, with the groups' statuses as what each group holds."""

    def __init__(self, dra: DraObjects, groups: Sequence[Mapping[str, Any]]) -> None:
        held: dict[tuple[str, str], Mapping[str, Sequence[str]]] = {}
        for group in groups:
            meta, status = group.get("metadata") or {}, group.get("status") or {}
            if status.get("nodeName") and status.get("allocatedDevices"):
                held[(str(meta.get("namespace", "")), str(meta.get("name", "")))] = status["allocatedDevices"]
        self._inventory = drainventory.DraInventory(held.get)
        for kind, bodies in zip(KINDS, (dra.slices, dra.classes, dra.claims), strict=True):
            self._inventory.replace(kind, bodies)
        self._foreign: dict[str, list[str]] = {}
        for claim in self._inventory.claims():
            if not self._inventory.ours(claim):
                for device in claim.devices:
                    self._foreign.setdefault(device, []).append(f"{claim.key[0]}/{claim.key[1]}")

    def node(self, base: inventory.NodeInfo) -> inventory.NodeInfo:
        """The node as the operator takes it: its DRA devices per class, the extended resource they replace gone."""
        return self._inventory.node(base)

    def tainted(self, device: str) -> bool:
        found = self._inventory.device(device)
        return found is not None and found.tainted

    def claims(self, device: str) -> tuple[str, ...]:
        """The claims (``namespace/name``) not made by deviceshare whose allocation holds ``device``."""
        return tuple(sorted(self._foreign.get(device, ())))
