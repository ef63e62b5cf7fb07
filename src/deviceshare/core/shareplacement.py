"""Placement of a *sharing* group: which node, which devices on it, which tiles (CONTRACT §7).

The group's first shared resource (by name) leads: its share is measured in one dimension
(tiles, else compute when asked, else memory, see :func:`snapshots.dimension`), and nodes are
walked in that dimension's order through the ledger's indexes, never by scanning the cluster:

- ``binpack`` first walks partly used devices from the tightest that still fits upwards (a share
  goes where it leaves the least behind), then nodes with wholly free devices, fewest first;
- ``spread`` first walks nodes with wholly free devices, most first, then partly used devices
  from the emptiest down.

Within a node the same order picks the devices. :func:`order_key` states the resulting order for
one node, so the naive scan (:func:`placement.place_linear`) can rank every node the same way.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from deviceshare.core import capacity, devicechoice, reasons, snapshots


def leading(share: Mapping[str, capacity.Share]) -> tuple[str, capacity.Share]:
    resource = min(share)
    return resource, share[resource]


def _caps(state: snapshots.NodeState, resource: str) -> tuple[int | None, int]:
    info = state.info
    return info.device_memory.get(resource), info.device_tiles.get(resource, 0)


def _fresh_fits(share: capacity.Share, memory_cap: int | None, tiles_cap: int) -> bool:
    """Does the share fit on a device nobody uses?"""
    if share.tiles:
        return tiles_cap >= share.tiles
    return not share.memory_bytes or (memory_cap is not None and memory_cap >= share.memory_bytes)


def devices_failure(
    state: snapshots.NodeState, resources: Mapping[str, int], share: Mapping[str, capacity.Share]
) -> str | None:
    """The first requested resource (by name) the node cannot give, whole or as the share asks."""
    if state.info.problems:
        return reasons.INVALID_INVENTORY
    for resource in sorted(resources):
        count = resources[resource]
        free = state.free.get(resource, ())
        s = share.get(resource)
        if s is None:
            if len(free) < count:
                return reasons.insufficient(resource)
            continue
        failure = _share_failure(state, resource, count, s)
        if failure is not None:
            return failure
    return None


def _share_failure(state: snapshots.NodeState, resource: str, count: int, share: capacity.Share) -> str | None:
    if not state.info.devices.get(resource):  # a node without the device at all: not a question of memory
        return reasons.insufficient(resource)
    memory_cap, tiles_cap = _caps(state, resource)
    if share.tiles and not tiles_cap:
        return reasons.no_declared(resource, "tiles")
    if share.memory_bytes and memory_cap is None:
        return reasons.no_declared(resource, "memory")
    free = state.free.get(resource, ())
    partial = state.partial.get(resource, ())
    fitting = len(free) if _fresh_fits(share, memory_cap, tiles_cap) else 0
    if fitting >= count:
        return None
    fitting += sum(1 for left in partial if capacity.fits(left, share))
    if fitting >= count:
        return None
    seen = [*partial, *(capacity.fresh(d, memory_cap, tiles_cap, share.kind) for d in free)]
    return capacity.shortfall(resource, share, count, seen, memory_cap, tiles_cap) or reasons.insufficient(resource)


def _fitting_partial(
    state: snapshots.NodeState, resource: str, share: capacity.Share
) -> list[capacity.DeviceLeft]:
    """Partly used devices that take the share, tightest first, then in inventory order."""
    partial = state.partial.get(resource, ())
    position = {d: i for i, d in enumerate(state.info.devices.get(resource, ()))}
    fitting = [left for left in partial if capacity.fits(left, share)]
    fitting.sort(key=lambda left: (capacity.key(left, share), position.get(left.device, 0)))
    return fitting


def choose(
    state: snapshots.NodeState, resource: str, count: int, share: capacity.Share, descending: bool
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(devices, tiles) for one shared resource on a node that fits; binpack fills partly used devices first."""
    memory_cap, tiles_cap = _caps(state, resource)
    partial = _fitting_partial(state, resource, share)
    if descending:
        partial.reverse()
    free = state.free.get(resource, ()) if _fresh_fits(share, memory_cap, tiles_cap) else ()
    offered = state.info.devices.get(resource, ())
    links = state.info.topology.get(resource)
    picked: list[capacity.DeviceLeft] = []
    if descending:
        fresh = devicechoice.choose_devices(offered, free, min(count, len(free)), links)
        picked = [capacity.fresh(d, memory_cap, tiles_cap, share.kind) for d in fresh]
        picked += partial[: count - len(picked)]
    else:
        picked = partial[:count]
        fresh = devicechoice.choose_devices(offered, free, count - len(picked), links)
        picked += [capacity.fresh(d, memory_cap, tiles_cap, share.kind) for d in fresh]
    devices = tuple(left.device for left in picked)
    if not share.tiles:
        return devices, ()
    tiles = tuple(t for left in picked for t in capacity.tile_ids(left.device, left.free_tiles[: share.tiles]))
    return devices, tiles


def order_key(state: snapshots.NodeState, share: Mapping[str, capacity.Share], descending: bool) -> tuple[int, int]:
    """Where a fitting node ranks (smaller first; the node name breaks ties), as the indexed walk ranks it."""
    resource, s = leading(share)
    free = len(state.free.get(resource, ()))
    fitting = _fitting_partial(state, resource, s)
    if descending:
        if free:
            return (0, -free)
        return (1, -capacity.key(fitting[-1], s)) if fitting else (2, 0)
    if fitting:
        return (0, capacity.key(fitting[0], s))
    return (1, free)


def candidates(
    snapshot: snapshots.LedgerSnapshot, share: Mapping[str, capacity.Share], descending: bool
) -> Iterator[snapshots.NodeState]:
    """Open nodes in :func:`order_key` order (each once) that may fit the leading share."""
    resource, s = leading(share)
    dim, need = snapshots.dimension(s), snapshots.need(s)
    nodes = snapshot.nodes
    seen: set[str] = set()

    def partly_used() -> Iterator[snapshots.NodeState]:
        for _, (name, device) in snapshot.part_candidates(resource, dim, need, descending):
            if name in seen:
                continue
            state = nodes[name]
            left = next((x for x in state.partial.get(resource, ()) if x.device == device), None)
            if left is None or not capacity.fits(left, s):
                continue  # fits in this dimension, not in the other: the node may still come by another device
            seen.add(name)
            yield state

    def with_free_devices() -> Iterator[snapshots.NodeState]:
        for state in snapshot.candidate_states(resource, 1, descending):
            if state.info.name not in seen:
                seen.add(state.info.name)
                yield state

    if descending:
        yield from with_free_devices()
        yield from partly_used()
    else:
        yield from partly_used()
        yield from with_free_devices()
