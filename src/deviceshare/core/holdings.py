"""Who holds each device, whole or in parts: the ledger's two maps and the pure rules over them.

The ledger keeps ``held`` (device -> groups holding it whole; more than one only after a rebuild
found it so) and ``uses`` (device -> the parts it gave out to sharing groups). What a reservation
must pass, how an allocation is entered and taken out, what a node has left, who holds a device
and which held devices the inventory no longer offers follow from these two maps and the node's
inventory alone; they live here so each reads (and is tested) without the ledger's locking,
revisions and indexes around it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from deviceshare.api import names
from deviceshare.core import capacity, claims, inventory

GroupKey = inventory.GroupKey
DeviceKey = tuple[str, str, str]  # (node, resource, device)
Held = dict[DeviceKey, tuple[GroupKey, ...]]
Uses = dict[DeviceKey, capacity.DeviceUse]


def check_reservable(
    held: Held,
    uses: Uses,
    node: str,
    info: inventory.NodeInfo | None,
    wanted: Mapping[str, Sequence[str]],
    shares: Mapping[str, capacity.Share],
    per_device: Mapping[str, Mapping[str, tuple[int, ...]]],
) -> None:
    """Raise :class:`claims.DeviceConflict` for the first wanted device that cannot take the request:
    not offered by the node, held whole, shared (for a whole-device request), or without room left."""
    for resource, ids in wanted.items():
        offered = info.devices.get(resource, ()) if info is not None else ()
        sick = info.unhealthy.get(resource, frozenset()) if info is not None else frozenset()
        withheld = info.withheld.get(resource, frozenset()) if info is not None else frozenset()
        s = shares.get(resource)
        for device in ids:
            if device not in offered:
                detail = "" if info is not None else "node is not in the inventory"
                raise claims.DeviceConflict(node, resource, device, None, detail)
            if device in sick:
                raise claims.DeviceConflict(node, resource, device, None, "the node reports the device unhealthy")
            if device in withheld:
                raise claims.DeviceConflict(node, resource, device, None, "the device is tainted or allocated by "
                                                                          "another ResourceClaim")
            key = (node, resource, device)
            holders = held.get(key)
            if holders:
                raise claims.DeviceConflict(node, resource, device, holders[0])
            use = uses.get(key)
            if s is None:
                if use is not None:
                    raise claims.DeviceConflict(
                        node, resource, device, use.groups[0],
                        f"shared by {', '.join(map(names.key_text, use.groups))}",
                    )
                continue
            assert info is not None
            problem = capacity.join_problem(info, resource, device, use, s, per_device.get(resource, {}))
            if problem:
                raise claims.DeviceConflict(node, resource, device, use.groups[0] if use else None, problem)


def hold(held: Held, uses: Uses, allocation: claims.Allocation) -> None:
    """Enter an allocation: its whole devices beside any other holder, its parts into the devices' uses."""
    tiles = {r: capacity.parse_tile_ids(ids) for r, ids in allocation.tiles.items() if r in allocation.share}
    for resource, ids in allocation.devices.items():
        s = allocation.share.get(resource)
        for device in ids:
            key = (allocation.node, resource, device)
            if s is None:
                held[key] = (*held.get(key, ()), allocation.group)
            else:
                part = capacity.Part(allocation.group, s, tiles.get(resource, {}).get(device, ()))
                uses[key] = capacity.with_part(uses.get(key), part)


def release(held: Held, uses: Uses, allocation: claims.Allocation) -> None:
    """Take an allocation out: its group leaves every device it held or used; other claimants stay."""
    group = allocation.group
    for resource, ids in allocation.devices.items():
        for device in ids:
            key = (allocation.node, resource, device)
            rest = tuple(g for g in held.get(key, ()) if g != group)
            if rest:
                held[key] = rest
            else:
                held.pop(key, None)
            if key in uses:
                use = capacity.without_group(uses[key], group)
                if use is None:
                    del uses[key]
                else:
                    uses[key] = use


def left_on(
    name: str, info: inventory.NodeInfo, held: Held, uses: Uses
) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[capacity.DeviceLeft, ...]]]:
    """A node's wholly free devices and, per resource, its devices in partial use that can take more
    (both in inventory order); a device held whole, mixed by a rebuild, that the node reports unhealthy
    (CONTRACT §9: no new group on it, whatever the policy) or that DRA withholds (§13) is in neither."""
    free: dict[str, tuple[str, ...]] = {}
    partial: dict[str, tuple[capacity.DeviceLeft, ...]] = {}
    for resource, ids in info.devices.items():
        sick = info.unhealthy.get(resource)
        if sick:
            ids = tuple(d for d in ids if d not in sick)
        withheld = info.withheld.get(resource)
        if withheld:
            ids = tuple(d for d in ids if d not in withheld)
        if not uses:  # the common case, and every node of a cluster without sharing groups
            free[resource] = tuple(d for d in ids if (name, resource, d) not in held)
            continue
        mem_cap, tiles_cap = info.device_memory.get(resource), info.device_tiles.get(resource, 0)
        whole: list[str] = []
        parts: list[capacity.DeviceLeft] = []
        for d in ids:
            key = (name, resource, d)
            if key in held:
                continue
            use = uses.get(key)
            if use is None:
                whole.append(d)
                continue
            left = capacity.left_of(d, use, mem_cap, tiles_cap)
            if left is not None:
                parts.append(left)
        free[resource] = tuple(whole)
        if parts:
            partial[resource] = tuple(parts)
    return free, partial


def holders(held: Held, uses: Uses, key: DeviceKey) -> tuple[GroupKey, ...]:
    """Every group holding the device or a part of it: whole holders first, then sharers by name."""
    use = uses.get(key)
    return held.get(key, ()) + (use.groups if use is not None else ())


def problems(held: Held, uses: Uses, nodes: Mapping[str, inventory.NodeInfo]) -> tuple[str, ...]:
    """Held devices the inventory no longer (or never) offered, one line each."""
    found = []
    for key in sorted(set(held) | set(uses)):
        node, resource, device = key
        groups = ", ".join(map(names.key_text, holders(held, uses, key)))
        info = nodes.get(node)
        if info is None:
            found.append(f"{resource}={device} on unknown node {node} is held by {groups}")
        elif device not in info.devices.get(resource, ()):
            found.append(f"{resource}={device} held by {groups} is not in node {node}'s inventory")
    return tuple(found)
