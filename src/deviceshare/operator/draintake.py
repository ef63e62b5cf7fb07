"""Dynamic Resource Allocation's objects into the operator's state: the rebuild's one list of ResourceSlices,
DeviceClasses and ResourceClaims, then their watches from those lists' resourceVersions (as for nodes, groups and
pods: ``runtime.py``, ``intake.py``), each event folded into the :class:`~.drainventory.DraInventory` and the
ledger's view of the nodes it changes.

A cluster that does not serve ``resource.k8s.io/v1`` (404 on the list) has no DRA for that term: nothing is
watched, every node offers what its Node object says.

Also here: the claims a rebuild trusts. Only a claim of ours (owned by its group, by uid, named ``<group>-devices``)
says what deviceshare gave that group; its allocation is rebuilt into the ledger beside the groups' statuses (a
status wins where both speak: ``claims.choose``). Anybody else's allocation is never a holding of a group, only
devices taken (``NodeInfo.withheld``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from deviceshare.api import names
from deviceshare.core import capacity
from deviceshare.core import ledger as ledgers

from . import drainventory, storage
from . import state as state_
from .storage import drastatus

logger = logging.getLogger(__name__)

KINDS = drastatus.WATCHED


@dataclasses.dataclass
class Listed:
    """The rebuild's lists: bodies by kind, and their resourceVersions (None: DRA not served)."""

    bodies: dict[str, list[dict[str, Any]]]
    versions: dict[str, str | None] | None


async def list_all(api: storage.ClusterApi) -> Listed:
    try:
        listings = await asyncio.gather(*(api.list_dra(kind) for kind in KINDS))
    except storage.Gone:
        logger.info("resource.k8s.io/v1 is not served: no Dynamic Resource Allocation this term")
        return Listed({}, None)
    return Listed({k: list(lst.items) for k, lst in zip(KINDS, listings, strict=True)},
                  {k: lst.resource_version for k, lst in zip(KINDS, listings, strict=True)})


def fill(dra: drainventory.DraInventory, listed: Listed) -> None:
    """Classes first (a slice's devices are matched against them), then slices, then claims."""
    for kind in (drastatus.CLASSES, drastatus.SLICES, drastatus.CLAIMS):
        dra.replace(kind, listed.bodies.get(kind, ()))


def our_claims(dra: drainventory.DraInventory, groups: Mapping[tuple[str, str], state_.GroupRecord]) -> list[
        ledgers.Claim]:
    """The allocations of our groups' own claims, as claims for the ledger's rebuild (see the module docstring)."""
    out: list[ledgers.Claim] = []
    for claim in dra.claims():
        group = claim.owner
        record = groups.get(group) if group is not None else None
        if group is None or record is None or claim.key != (group[0], names.claim_name(group[1])):
            continue
        if claim.owner_uid != record.uid:  # names the group but is not its (a tenant's, or an earlier group's)
            logger.warning("ResourceClaim %s/%s: not owned by this group %s (uid %s): not trusted as its holding",
                           *claim.key, group[1], record.uid)
            continue
        devices = sorted(claim.devices)
        node = _node_of(dra, devices)
        resource = _resource_of(dra, node, devices)
        if node is None or resource is None:
            logger.warning("ResourceClaim %s/%s: its allocation names devices no node offers together: %s",
                           *claim.key, devices)
            continue
        shares = capacity.shares_from_spec(record.spec.share) if record.spec is not None and claim.shared else {}
        out.append(ledgers.Claim(group=group, node=node, devices={resource: tuple(devices)},
                                 source=f"ResourceClaim {claim.key[0]}/{claim.key[1]}",
                                 share={r: s for r, s in shares.items() if r == resource}))
    return out


def _node_of(dra: drainventory.DraInventory, devices: list[str]) -> str | None:
    found = {dra.node_of(d) for d in devices}
    return found.pop() if len(found) == 1 else None


def _resource_of(dra: drainventory.DraInventory, node: str | None, devices: list[str]) -> str | None:
    """The DeviceClass (the ledger's resource) under which ``node`` offers all of ``devices``."""
    info = dra.view(node) if node is not None else None
    if info is None:
        return None
    return next((r for r, ids in sorted(info.devices.items()) if set(devices) <= set(ids)), None)


class DraFeed:
    """A reflector's sink for one DRA kind: each event into the inventory, each node it changes into the ledger,
    and then ``changed`` (parked pods may fit now)."""

    def __init__(
        self, kind: str, dra: Callable[[], drainventory.DraInventory], ledger: Callable[[], ledgers.DeviceLedger],
        changed: Callable[[], object],
    ) -> None:
        self.kind = kind
        self._dra, self._ledger, self._changed = dra, ledger, changed

    def apply(self, event_type: str, obj: Mapping[str, Any]) -> None:
        dra = self._dra()
        on = {drastatus.SLICES: dra.on_slice, drastatus.CLASSES: dra.on_class,
              drastatus.CLAIMS: dra.on_claim}[self.kind]
        self._refresh(on(event_type, obj))

    def replace(self, objects: list[Mapping[str, Any]], resource_version: str | None = None) -> None:
        self._refresh(self._dra().replace(self.kind, objects))

    def _refresh(self, nodes: Iterable[str]) -> None:
        dra, ledger = self._dra(), self._ledger()
        for name in sorted(nodes):
            info = dra.view(name)
            if info is not None:
                ledger.upsert_node(info)
        self._changed()


def refresh_all(dra: drainventory.DraInventory, ledger: ledgers.DeviceLedger) -> None:
    """Every node's view again (after a rebuild filled the ledger: which claims are ours depends on it)."""
    for name in dra.nodes():
        info = dra.view(name)
        if info is not None:
            ledger.upsert_node(info)
