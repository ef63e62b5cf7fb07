"""What one device has given out to sharing groups, and whether a share still fits (CONTRACT §7).

A device is used one way at a time: whole by one group (kept by the ledger as today), or in
parts. Parts are either compute/memory *shares* (summed compute at most 1000 milli, summed memory
at most the device's memory) or *tiles* (each tile held by one group). :class:`DeviceUse` is the
record of the parts a device gave out; :class:`DeviceLeft` is what placement reads of it. The
arithmetic lives here, apart from the ledger's locking and indexing, so it can be tested by table.

A rebuild from API state may find a device over-committed or used in two ways at once; the
record then keeps every part as claimed (nothing is dropped) and says so (:func:`overcommit`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from deviceshare.api import names, quantities
from deviceshare.core import inventory, reasons

if TYPE_CHECKING:  # annotations only: `deviceshare inspect --help` need not load pydantic
    from deviceshare.api import models

GroupKey = tuple[str, str]
COMPUTE_FULL = 1000  # milli: one device's compute


class Kind(enum.Enum):
    WHOLE = "whole"
    SHARED = "shared"  # compute and/or memory sharers
    TILES = "tiles"


@dataclass(frozen=True, slots=True)
class Share:
    """The part of each device of one resource a group takes; 0 means not asked."""

    compute_milli: int = 0
    memory_bytes: int = 0
    tiles: int = 0

    @property
    def kind(self) -> Kind:
        return Kind.TILES if self.tiles else Kind.SHARED

    @classmethod
    def from_spec(cls, share: models.DeviceShare) -> Share:
        if share.capacity is not None:  # a DRA group's capacity request (CONTRACT §13): memory, as the ledger counts it
            memory = share.capacity.get("memory")
            return cls(0, quantities.parse_bytes(memory) if memory is not None else 0, 0)
        return cls(share.compute_milli, share.memory_bytes, share.tiles or 0)

    def describe(self) -> str:
        """``compute=460m,memory=12Gi`` or ``tiles=1``."""
        if self.tiles:
            return f"tiles={self.tiles}"
        parts = []
        if self.compute_milli:
            parts.append(f"compute={quantities.format_milli(self.compute_milli)}")
        if self.memory_bytes:
            parts.append(f"memory={quantities.format_bytes(self.memory_bytes)}")
        return ",".join(parts)


@dataclass(frozen=True, slots=True)
class Part:
    group: GroupKey
    share: Share
    tiles: tuple[int, ...] = ()  # tile indices, for a tile holder


@dataclass(frozen=True, slots=True)
class DeviceUse:
    """The parts one device has given out, with their sums."""

    parts: tuple[Part, ...]  # sorted by group
    compute_milli: int
    memory_bytes: int
    tiles: tuple[int, ...]  # every taken tile index, sorted; repeats only after a rebuild

    @property
    def groups(self) -> tuple[GroupKey, ...]:
        return tuple(p.group for p in self.parts)

    @property
    def kinds(self) -> frozenset[Kind]:
        return frozenset(p.share.kind for p in self.parts)

    @property
    def kind(self) -> Kind | None:
        """The one kind of use, or None when a rebuild found both kinds on the device."""
        kinds = self.kinds
        return next(iter(kinds)) if len(kinds) == 1 else None


def _use(parts: Sequence[Part]) -> DeviceUse | None:
    if not parts:
        return None
    ordered = tuple(sorted(parts, key=lambda p: p.group))
    return DeviceUse(
        parts=ordered,
        compute_milli=sum(p.share.compute_milli for p in ordered if not p.share.tiles),
        memory_bytes=sum(p.share.memory_bytes for p in ordered if not p.share.tiles),
        tiles=tuple(sorted(t for p in ordered for t in p.tiles)),
    )


def with_part(use: DeviceUse | None, part: Part) -> DeviceUse:
    """``use`` plus one group's part (replacing an earlier part of the same group)."""
    rest = [p for p in (use.parts if use else ()) if p.group != part.group]
    made = _use([*rest, part])
    assert made is not None
    return made


def without_group(use: DeviceUse | None, group: GroupKey) -> DeviceUse | None:
    if use is None:
        return None
    return _use([p for p in use.parts if p.group != group])


@dataclass(frozen=True, slots=True)
class DeviceLeft:
    """What a device still offers sharers of its kind (what placement reads).

    ``memory_bytes`` is None where the node declared no memory for the resource; the left
    amounts are negative on a device a rebuild found over-committed.
    """

    device: str
    kind: Kind
    compute_milli: int
    memory_bytes: int | None
    free_tiles: tuple[int, ...]


def fresh(device: str, memory_cap: int | None, tiles_cap: int, kind: Kind) -> DeviceLeft:
    """A device nobody uses, as a sharer of ``kind`` sees it."""
    return DeviceLeft(device, kind, COMPUTE_FULL, memory_cap, tuple(range(tiles_cap)))


def left_of(device: str, use: DeviceUse, memory_cap: int | None, tiles_cap: int) -> DeviceLeft | None:
    """What is left of a device in partial use; None when it may take nobody (kinds mixed, or a rebuild
    found it over-committed: nobody gets any more of it until its holders let go)."""
    kind = use.kind
    if kind is None or overcommit(use, memory_cap, tiles_cap, whole=False) is not None:
        return None
    taken = set(use.tiles)
    return DeviceLeft(
        device=device,
        kind=kind,
        compute_milli=COMPUTE_FULL - use.compute_milli,
        memory_bytes=None if memory_cap is None else memory_cap - use.memory_bytes,
        free_tiles=tuple(t for t in range(tiles_cap) if t not in taken) if kind is Kind.TILES else (),
    )


def fits(left: DeviceLeft, share: Share) -> bool:
    """Does ``share`` fit on this device beside what it holds?"""
    if left.kind is not share.kind:
        return False
    if share.tiles:
        return len(left.free_tiles) >= share.tiles
    if share.compute_milli > left.compute_milli:
        return False
    if share.memory_bytes:
        return left.memory_bytes is not None and share.memory_bytes <= left.memory_bytes
    return True


def key(left: DeviceLeft, share: Share) -> int:
    """The amount a share is measured in on this device: what tightest-fit and the index sort by.

    Tiles for tile shares, compute when the share asks for compute, else memory. One dimension
    only, so an index can be walked in its order; the other dimension is checked device by device.
    """
    if share.tiles:
        return len(left.free_tiles)
    if share.compute_milli:
        return left.compute_milli
    return left.memory_bytes if left.memory_bytes is not None else -1


def shortfall(
    resource: str,
    share: Share,
    count: int,
    candidates: Sequence[DeviceLeft],
    memory_cap: int | None,
    tiles_cap: int,
) -> str | None:
    """Why fewer than ``count`` of ``candidates`` take the share, kube-scheduler style; None if they do."""
    if share.tiles and not tiles_cap:
        return reasons.no_declared(resource, "tiles")
    if share.memory_bytes and memory_cap is None:
        return reasons.no_declared(resource, "memory")
    if sum(1 for c in candidates if fits(c, share)) >= count:
        return None
    if not candidates:
        return reasons.insufficient(resource)
    if share.tiles:
        return reasons.insufficient(f"{resource} tiles")
    by_compute = sum(1 for c in candidates if c.kind is Kind.SHARED and share.compute_milli <= c.compute_milli)
    if by_compute < count:
        return reasons.insufficient(f"{resource} compute")
    return reasons.insufficient(f"{resource} memory")


def overcommit(use: DeviceUse, memory_cap: int | None, tiles_cap: int, whole: bool) -> str | None:
    """What is wrong with a device's use as a rebuild found it; None when it is within capacity."""
    if use.kind is None or whole:
        return "used both whole and in parts" if whole else "holds compute/memory sharers and tile holders"
    if use.compute_milli > COMPUTE_FULL:
        return f"compute {quantities.format_milli(use.compute_milli)} given out, more than 1"
    if use.memory_bytes and memory_cap is None:
        return "memory given out, but the node declares no device memory"
    if memory_cap is not None and use.memory_bytes > memory_cap:
        return (f"memory {quantities.format_bytes(use.memory_bytes)} given out, more than the device's "
                f"{quantities.format_bytes(memory_cap)}")
    if len(set(use.tiles)) != len(use.tiles):
        return "a tile is held by several groups"
    if any(t >= tiles_cap for t in use.tiles):
        return f"a tile index beyond the device's {tiles_cap} tiles"
    return None


def tile_ids(device: str, tiles: Sequence[int]) -> tuple[str, ...]:
    """``<device-id>.<tile>`` as status.allocatedTiles lists them."""
    return tuple(f"{device}.{t}" for t in tiles)


def parse_tile_ids(ids: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``["0.1", "1.0"]`` -> ``{"0": (1,), "1": (0,)}``; ValueError on a malformed ID."""
    out: dict[str, list[int]] = {}
    for tile_id in ids:
        device, dot, index = str(tile_id).rpartition(".")
        if not dot or not device or not index.isdigit():
            raise ValueError(f"tile {tile_id!r} is not <device-id>.<tile>")
        out.setdefault(device, []).append(int(index))
    return {d: tuple(sorted(t)) for d, t in out.items()}


def shares_from_spec(spec: Mapping[str, models.DeviceShare]) -> dict[str, Share]:
    return {r: Share.from_spec(s) for r, s in sorted(spec.items())}


def join_problem(
    info: inventory.NodeInfo,
    resource: str,
    device: str,
    use: DeviceUse | None,
    share: Share,
    tiles: Mapping[str, tuple[int, ...]],
) -> str:
    """Why ``share`` cannot join the device's current use; "" when it can."""
    mem_cap, tiles_cap = info.device_memory.get(resource), info.device_tiles.get(resource, 0)
    if use is None:
        left = fresh(device, mem_cap, tiles_cap, share.kind)
    else:
        found = left_of(device, use, mem_cap, tiles_cap)
        if found is None:
            return "over-committed or used two ways at once (see the rebuild's conflicts); it takes nobody new"
        left = found
    if left.kind is not share.kind:
        return f"holds {left.kind.value} holders ({', '.join(map(names.key_text, use.groups if use else ()))})"
    if share.tiles:
        if not tiles_cap:
            return f"node {info.name} declares no tiles for {resource}"
        taken = [t for t in tiles.get(device, ()) if t not in left.free_tiles]
        return f"tiles {taken} are taken or beyond the device's {tiles_cap}" if taken else ""
    if share.memory_bytes and mem_cap is None:
        return f"node {info.name} declares no device memory for {resource}"
    if fits(left, share):
        return ""
    memory_left = "" if left.memory_bytes is None else f", {quantities.format_bytes(left.memory_bytes)} memory"
    return (f"{share.describe()} does not fit beside its sharers "
            f"({quantities.format_milli(left.compute_milli)} compute{memory_left} left)")
