"""The device map ``inspect`` and ``explain`` show: which group holds which device on which node, rebuilt from
what the API holds (each group's ``status.nodeName`` / ``status.allocatedDevices`` / ``status.members``, each
node's inventory as :func:`deviceshare.core.inventory.node_from_object` reads it: the operator's own parser, so
device IDs match). Two groups claiming one device are a CONFLICT. A shared device (CONTRACT §7) lists each holder
with its share and what is left; the capacity arithmetic is the core's (:mod:`deviceshare.core.capacity`), so a
device is a CONFLICT here exactly when the operator would report it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from deviceshare.api import names, quantities
from deviceshare.cli import draview, linkview, shareview
from deviceshare.core import capacity, inventory
from deviceshare.core import topology as topologies

FREE = "-"
CONFLICT = "CONFLICT"
NOT_IN_INVENTORY = "NOT-IN-INVENTORY"
UNHEALTHY = "UNHEALTHY"
TAINTED = "TAINTED"


@dataclasses.dataclass(frozen=True)
class Holder:
    """One group that names a device in its status."""

    namespace: str
    name: str
    phase: str
    members: tuple[str, ...]
    share: capacity.Share | None = None  # of this device's resource; None: the whole device
    tiles: tuple[int, ...] = ()  # tile indices of this device, for a tile holder

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def describe_share(self) -> str:
        if self.share is None:
            return "whole"
        text = self.share.describe()
        return f"{text}:{','.join(map(str, self.tiles))}" if self.tiles else text


@dataclasses.dataclass(frozen=True)
class Device:
    id: str
    holders: tuple[Holder, ...]
    in_inventory: bool = True
    memory_cap: int | None = None  # bytes the node declares per device of this resource
    tiles_cap: int = 0
    unhealthy: bool = False  # the node reports it so (deviceshare.io/device-health): no new group gets it
    tainted: bool = False  # a DRA device tainted NoSchedule/NoExecute: no new group gets it
    claims: tuple[str, ...] = ()  # ResourceClaims (namespace/name) not deviceshare's whose allocation holds it

    def use(self) -> capacity.DeviceUse | None:
        """The parts sharing holders took, summed by the core's arithmetic; None when nobody shares."""
        use: capacity.DeviceUse | None = None
        for h in self.holders:
            if h.share is not None:
                use = capacity.with_part(use, capacity.Part((h.namespace, h.name), h.share, h.tiles))
        return use

    @property
    def problem(self) -> str | None:
        """What is wrong with the holders together (as the operator's rebuild would report it), or None."""
        whole = sum(1 for h in self.holders if h.share is None)
        if whole > 1:
            return "held by several groups"
        use = self.use()
        if use is None:
            return None
        return capacity.overcommit(use, self.memory_cap, self.tiles_cap, whole=bool(whole))

    @property
    def conflict(self) -> bool:
        return self.problem is not None

    def left(self) -> dict[str, Any]:
        """What sharers of the device's kind may still take (``{"compute": "540m", "memory": "56Gi"}``,
        ``{"tiles": 1}``); empty for a device held whole or free."""
        use = self.use()
        if use is None or use.kind is None:
            return {}
        if use.kind is capacity.Kind.TILES:
            return {"tiles": max(0, self.tiles_cap - len(set(use.tiles)))}
        left: dict[str, Any] = {
            "compute": quantities.format_milli(max(0, capacity.COMPUTE_FULL - use.compute_milli))}
        if self.memory_cap is not None:
            left["memory"] = quantities.format_bytes(max(0, self.memory_cap - use.memory_bytes))
        return left


@dataclasses.dataclass(frozen=True)
class NodeDevices:
    """One node's devices of every resource, in inventory order (unknown IDs groups claim last)."""

    name: str
    shared: bool
    ready: bool
    exists: bool
    resources: Mapping[str, tuple[Device, ...]]
    problems: tuple[str, ...] = ()
    topology: Mapping[str, topologies.Topology] = dataclasses.field(default_factory=dict)

    def total(self, resource: str) -> int:
        return sum(1 for d in self.resources.get(resource, ()) if d.in_inventory)

    def allocated(self, resource: str) -> int:
        return sum(1 for d in self.resources.get(resource, ()) if d.in_inventory and (d.holders or d.claims))

    def free(self, resource: str) -> list[str]:
        """Devices a new group could get: in the inventory, held by nobody (no group, no other claim), not
        unhealthy, not tainted."""
        return [d.id for d in self.resources.get(resource, ())
                if d.in_inventory and not d.holders and not d.claims and not d.unhealthy and not d.tainted]

    def links(self, resource: str) -> dict[str, list[str]]:
        """Group ref -> its devices of ``resource`` on this node, for the links they have."""
        return linkview.holders(self.resources.get(resource, ()))


def _holder(group: Mapping[str, Any]) -> Holder:
    meta, status = group.get("metadata") or {}, group.get("status") or {}
    return Holder(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        phase=str(status.get("phase") or names.PHASE_PENDING),
        members=tuple(str(m) for m in status.get("members") or []),
    )


def device_map(
    nodes: Sequence[Mapping[str, Any]], groups: Sequence[Mapping[str, Any]], dra: draview.DraObjects | None = None
) -> list[NodeDevices]:
    """Per node: every device and the groups whose status holds it; with ``dra``, a node's DRA devices folded in as
    the operator folds them (:mod:`deviceshare.cli.draview`).

    Shown: nodes in shared mode, plus any node a group's status points at (even a missing one,
    so a group stranded on a deleted node is visible). Sorted by node name.
    """
    claims: dict[str, dict[str, dict[str, list[Holder]]]] = {}  # node -> resource -> id -> holders
    for group in sorted(groups, key=lambda g: (_holder(g).namespace, _holder(g).name)):
        status = group.get("status") or {}
        node = status.get("nodeName")
        if not node:
            continue
        holder, shares = _holder(group), shareview.shares(group)
        for resource, ids in (status.get("allocatedDevices") or {}).items():
            tiles = shareview.tiles(status, resource)
            for device_id in ids or []:
                held = dataclasses.replace(holder, share=shares.get(resource), tiles=tiles.get(str(device_id), ()))
                claims.setdefault(str(node), {}).setdefault(resource, {}).setdefault(str(device_id), []).append(held)

    folded = draview.Folded(dra or draview.DraObjects(), groups)
    infos = {info.name: info for info in (folded.node(inventory.node_from_object(n)) for n in nodes)}
    out: list[NodeDevices] = []
    for name in sorted({n for n, i in infos.items() if i.shared} | set(claims)):
        info = infos.get(name)
        offered = dict(info.devices) if info is not None else {}
        claimed = claims.get(name, {})
        resources: dict[str, tuple[Device, ...]] = {}
        for resource in sorted(set(offered) | set(claimed)):
            ids = offered.get(resource, ())
            by_id = claimed.get(resource, {})
            memory_cap = info.device_memory.get(resource) if info else None
            tiles_cap = info.device_tiles.get(resource, 0) if info else 0
            sick = info.unhealthy.get(resource, frozenset()) if info else frozenset()
            withheld = info.withheld.get(resource, frozenset()) if info else frozenset()
            devices = [Device(i, tuple(by_id.get(i, ())), memory_cap=memory_cap, tiles_cap=tiles_cap,
                              unhealthy=i in sick, tainted=i in withheld and folded.tainted(i),
                              claims=folded.claims(i)) for i in ids]
            devices += [Device(i, tuple(h), False, memory_cap, tiles_cap)
                        for i, h in sorted(by_id.items()) if i not in ids]
            resources[resource] = tuple(devices)
        out.append(NodeDevices(
            name=name,
            shared=bool(info and info.shared),
            ready=bool(info and info.ready),
            exists=info is not None,
            resources=resources,
            problems=tuple(info.problems) if info is not None else ("node not found",),
            topology=dict(info.topology) if info is not None else {},
        ))
    return out


# -- reading -----------------------------------------------------------------------------------
