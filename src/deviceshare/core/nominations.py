"""Devices kept for a preemptor while its victims leave (CONTRACT §8 nomination), as pure data.

After a preemption decision the preemptor is *nominated* on the node: the devices (or shares) and the
CPU/memory being freed for it must not be taken meanwhile by a group of equal or lower priority. A
higher-priority group may take them, as kube-scheduler lets a more important pod take a nominated
pod's room (the nominee then decides again). :class:`Nominations` is the operator's record of them, an
immutable value it replaces on each change; :func:`withhold` and :func:`overlay` give the node states
and the snapshot a group of a given priority sees, so placement, gang start and preemption all honour
nominations through the one placement engine. Expiry is the caller's clock: ``expires`` is compared
with the ``now`` it passes.

What is withheld is the nominee's planned allocation, taken off what the node has left *now*: while a
victim is still leaving, its part and the nominee's are both counted (the node looks fuller than it
will be), which may keep a lower-priority group waiting a moment but never gives a device twice.
The walk order of the ledger's free-capacity index is not refiled for nominated nodes; the filters
decide on the withheld states, so a nominated node is only visited at its old rank.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from deviceshare.core import capacity, inventory, snapshots

GroupKey = inventory.GroupKey


@dataclass(frozen=True, slots=True)
class Nomination:
    """A preemptor's claim on a node while its victims leave: the allocation it will take there."""

    group: GroupKey
    node: str
    priority: int
    devices: Mapping[str, tuple[str, ...]]
    expires: float  # on the caller's clock
    share: Mapping[str, capacity.Share] = field(default_factory=dict)  # absent: whole devices
    tiles: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # "<device>.<tile>"
    cpu_milli: int = 0  # what its pending members request
    memory_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Victim:
    """A group whose members on ``node`` are being evicted to make room for the nominee ``by``: it takes no
    new member meanwhile, and is released once they are gone (or left alone once ``expires`` has passed)."""

    by: GroupKey
    priority: int
    node: str
    expires: float  # on the caller's clock


@dataclass(frozen=True, slots=True)
class Nominations:
    """Every live nomination, one per group, indexed by node. Replace, never mutate."""

    by_group: Mapping[GroupKey, Nomination] = field(default_factory=dict)

    @property
    def by_node(self) -> Mapping[str, tuple[Nomination, ...]]:
        out: dict[str, list[Nomination]] = {}
        for nomination in self.by_group.values():
            out.setdefault(nomination.node, []).append(nomination)
        return {node: tuple(sorted(noms, key=lambda n: n.group)) for node, noms in out.items()}

    def nominate(self, nomination: Nomination) -> Nominations:
        return Nominations({**self.by_group, nomination.group: nomination})

    def clear(self, group: GroupKey) -> Nominations:
        """Without ``group``'s nomination (it bound, gave up, or was deleted)."""
        if group not in self.by_group:
            return self
        return Nominations({k: v for k, v in self.by_group.items() if k != group})

    def expired(self, now: float) -> tuple[Nomination, ...]:
        return tuple(n for _, n in sorted(self.by_group.items()) if n.expires <= now)

    def live(self, now: float) -> Nominations:
        """Without the nominations whose time is up."""
        if not self.expired(now):
            return self
        return Nominations({k: v for k, v in self.by_group.items() if v.expires > now})

    def binding(self, node: str, priority: int, group: GroupKey | None = None) -> tuple[Nomination, ...]:
        """The nominations on ``node`` a group of ``priority`` must leave alone (not its own)."""
        return tuple(
            n for n in self.by_group.values()
            if n.node == node and n.priority >= priority and n.group != group
        )

    def __len__(self) -> int:
        return len(self.by_group)


NONE = Nominations()


def _without_share(left: capacity.DeviceLeft, share: capacity.Share, tiles: Iterable[int]) -> capacity.DeviceLeft:
    if share.tiles:
        taken = set(tiles)
        return dataclasses.replace(left, free_tiles=tuple(t for t in left.free_tiles if t not in taken))
    return dataclasses.replace(
        left,
        compute_milli=left.compute_milli - share.compute_milli,
        memory_bytes=None if left.memory_bytes is None else left.memory_bytes - share.memory_bytes,
    )


def withhold(state: snapshots.NodeState, kept: Iterable[Nomination]) -> snapshots.NodeState:
    """The node as a group sees it when ``kept`` nominations on it are not its to take."""
    kept = tuple(kept)
    if not kept:
        return state
    info = state.info
    free = {r: list(ids) for r, ids in state.free.items()}
    partial = {r: list(lefts) for r, lefts in state.partial.items()}
    cpu, memory = state.cpu_used, state.memory_used
    for nomination in kept:
        cpu += nomination.cpu_milli
        memory += nomination.memory_bytes
        for resource, ids in nomination.devices.items():
            share = nomination.share.get(resource)
            tiles = capacity.parse_tile_ids(nomination.tiles.get(resource, ())) if share else {}
            lefts = partial.setdefault(resource, [])
            for device in ids:
                if device in free.get(resource, ()):
                    free[resource].remove(device)
                    if share is not None:  # a fresh device becomes a partly used one of the share's kind
                        fresh = capacity.fresh(
                            device, info.device_memory.get(resource), info.device_tiles.get(resource, 0), share.kind
                        )
                        lefts.append(_without_share(fresh, share, tiles.get(device, ())))
                    continue
                at = next((i for i, left in enumerate(lefts) if left.device == device), None)
                if at is None:
                    continue  # held by someone still: not offered anyway
                if share is None or lefts[at].kind is not share.kind:
                    del lefts[at]  # nothing of it is offered to anyone else
                else:
                    lefts[at] = _without_share(lefts[at], share, tiles.get(device, ()))
    return snapshots.NodeState(
        info,
        {r: tuple(ids) for r, ids in free.items()},
        cpu,
        memory,
        {r: _in_inventory_order(info, r, lefts) for r, lefts in partial.items() if lefts},
    )


def _in_inventory_order(
    info: inventory.NodeInfo, resource: str, lefts: Iterable[capacity.DeviceLeft]
) -> tuple[capacity.DeviceLeft, ...]:
    position = {d: i for i, d in enumerate(info.devices.get(resource, ()))}
    return tuple(sorted(lefts, key=lambda left: position.get(left.device, 0)))


def overlay(
    snapshot: snapshots.LedgerSnapshot, nominations: Nominations, priority: int, group: GroupKey | None = None
) -> snapshots.LedgerSnapshot:
    """The snapshot a group of ``priority`` places on: nominations of equal or higher priority (but its
    own) withheld on their nodes. The same snapshot when none applies."""
    touched: dict[str, snapshots.NodeState] = {}
    for node, noms in nominations.by_node.items():
        kept = [n for n in noms if n.priority >= priority and n.group != group]
        state = snapshot.nodes.get(node)
        if kept and state is not None:
            touched[node] = withhold(state, kept)
    if not touched:
        return snapshot
    shards = list(snapshot.nodes.shards)
    for node, state in touched.items():
        i = hash(node) % snapshots.SHARDS
        if shards[i] is snapshot.nodes.shards[i]:
            shards[i] = dict(shards[i])
        shards[i][node] = state
    return snapshots.LedgerSnapshot(
        revision=snapshot.revision,
        nodes=snapshots.NodeStates(tuple(shards)),
        index=snapshot.index,
        parts=snapshot.parts,
        filter_classes=snapshot.filter_classes,
    )
