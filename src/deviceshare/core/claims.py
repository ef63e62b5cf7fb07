"""Allocations as the ledger holds them and as the API shows them (claims), and what a rebuild reports.

After a start or a leader change the ledger is rebuilt from *claims*: each group's status, and
its member pods' ``selected-devices`` annotations. A sharing group's claim carries its share
(read back from its spec, immutable once Bound) and its tiles. :func:`choose` keeps one claim per
group (the status wins over pods, reported); whatever is wrong across groups (a device held
twice, used whole and in parts, over-committed) becomes a :class:`ClaimConflict`, never resolved
by picking a winner.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from deviceshare.api import names
from deviceshare.core import capacity, inventory

GroupKey = tuple[str, str]
HELD_TWICE = "held by several groups"


class AllocationState(enum.Enum):
    RESERVED = "reserved"  # decided and held, not yet persisted in the group's status
    COMMITTED = "committed"  # persisted in the API


@dataclass(frozen=True, slots=True)
class Allocation:
    group: GroupKey
    node: str
    devices: Mapping[str, tuple[str, ...]]
    state: AllocationState
    share: Mapping[str, capacity.Share] = field(default_factory=dict)  # absent: whole devices
    tiles: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # "<device>.<tile>"


class DeviceConflict(Exception):
    """A requested device is held by another group, cannot take the share, or is not offered."""

    def __init__(
        self, node: str, resource: str, device: str, holder: GroupKey | None, detail: str = ""
    ) -> None:
        self.node, self.resource, self.device, self.holder = node, resource, device, holder
        if not detail:
            detail = (
                f"held by group {names.key_text(holder)}" if holder else "not offered by the node's inventory"
            )
        super().__init__(f"device {resource}={device} on node {node}: {detail}")


def committed(allocation: Allocation) -> Allocation:
    return dataclasses.replace(allocation, state=AllocationState.COMMITTED)


@dataclass(frozen=True, slots=True)
class Claim:
    """A group's devices as the API shows them (its status, or a member pod's annotation)."""

    group: GroupKey
    node: str
    devices: Mapping[str, Sequence[str]]
    source: str  # "status of ml/trainer" (wins over pods) or "pod ml/trainer-0"
    share: Mapping[str, capacity.Share] = field(default_factory=dict)  # resource -> share; absent: whole
    tiles: Mapping[str, Sequence[str]] = field(default_factory=dict)  # resource -> "<device>.<tile>"

    @property
    def from_status(self) -> bool:
        return self.source.startswith("status")


@dataclass(frozen=True, slots=True)
class ClaimConflict:
    node: str
    resource: str
    device: str
    groups: tuple[GroupKey, ...]
    reason: str = HELD_TWICE


@dataclass(frozen=True, slots=True)
class RebuildReport:
    allocations: int
    conflicts: tuple[ClaimConflict, ...]
    problems: tuple[str, ...]


def normalized(devices: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
    return {str(r): tuple(str(d) for d in ids) for r, ids in sorted(devices.items())}


def requested(
    devices: Mapping[str, Sequence[str]],
    share: Mapping[str, capacity.Share] | None,
    tiles: Mapping[str, Sequence[str]] | None,
) -> tuple[dict[str, tuple[str, ...]], dict[str, capacity.Share], dict[str, tuple[str, ...]],
           dict[str, dict[str, tuple[int, ...]]]]:
    """A reservation's request in the ledger's form: (devices, shares, tiles, tile indices per device), each
    sorted by resource; ValueError when a resource's devices repeat or tiles and devices do not match."""
    wanted = normalized(devices)
    shares = dict(sorted((share or {}).items()))
    wanted_tiles = normalized(tiles or {})
    for resource, ids in wanted.items():
        if len(set(ids)) != len(ids):
            raise ValueError(f"device IDs of {resource} repeat: {list(ids)}")
    return wanted, shares, wanted_tiles, tiles_by_device(wanted, shares, wanted_tiles)


def already_holds(existing: Allocation, group: GroupKey) -> DeviceConflict:
    """What a second, different reservation for a group that holds devices raises: one allocation per group."""
    resource, ids = next(iter(existing.devices.items()), ("", ()))
    return DeviceConflict(
        existing.node, resource, ids[0] if ids else "", group,
        f"group {names.key_text(group)} already holds devices on node {existing.node}; release them first",
    )


def render(devices: Mapping[str, Sequence[str]]) -> str:
    return "{" + ", ".join(f"{r}: {','.join(ids)}" for r, ids in sorted(devices.items())) + "}"


def _same(a: Claim, b: Claim) -> bool:
    return (
        a.node == b.node
        and normalized(a.devices) == normalized(b.devices)
        and dict(a.share) == dict(b.share)
        and (not a.tiles or not b.tiles or normalized(a.tiles) == normalized(b.tiles))
    )


def choose(claims: Iterable[Claim], problems: list[str]) -> dict[GroupKey, Claim]:
    """One claim per group: the first seen, or the status over a pod; disagreements reported."""
    chosen: dict[GroupKey, Claim] = {}
    for claim in claims:
        current = chosen.get(claim.group)
        if current is None:
            chosen[claim.group] = claim
            continue
        if _same(current, claim):
            if claim.tiles and not current.tiles:  # pods do not carry tiles; keep the claim that does
                chosen[claim.group] = claim
            continue
        status_wins = claim.from_status and not current.from_status
        winner, loser = (claim, current) if status_wins else (current, claim)
        chosen[claim.group] = winner
        problems.append(
            f"group {names.key_text(claim.group)}: {loser.source} says node {loser.node} "
            f"{render(loser.devices)} but {winner.source} says node {winner.node} "
            f"{render(winner.devices)}; using {winner.source}"
        )
    return chosen


def tiles_by_device(
    devices: Mapping[str, tuple[str, ...]],
    share: Mapping[str, capacity.Share],
    tiles: Mapping[str, tuple[str, ...]],
) -> dict[str, dict[str, tuple[int, ...]]]:
    """resource -> device -> tile indices; ValueError when tiles and devices do not match."""
    stray = sorted(r for r in tiles if not (r in share and share[r].tiles))
    if stray:
        raise ValueError(f"tiles given for {stray}, which the allocation does not take in tiles")
    out: dict[str, dict[str, tuple[int, ...]]] = {}
    for resource, s in share.items():
        if resource not in devices:
            raise ValueError(f"a share of {resource}, which the allocation holds no device of")
        if not s.tiles:
            continue
        parsed = capacity.parse_tile_ids(tiles.get(resource, ()))
        for device in devices[resource]:
            got = parsed.get(device, ())
            if len(got) != s.tiles or len(set(got)) != len(got):
                raise ValueError(f"{resource} device {device} needs {s.tiles} distinct tiles, got {list(got)}")
        if set(parsed) - set(devices[resource]):
            raise ValueError(f"{resource} tiles {sorted(set(parsed) - set(devices[resource]))} name other devices")
        out[resource] = parsed
    return out


def as_allocation(claim: Claim, info: inventory.NodeInfo | None, problems: list[str]) -> Allocation:
    """A claim as a committed allocation, exactly as claimed; what looks wrong goes to ``problems``."""
    devices = normalized(claim.devices)
    for resource, ids in devices.items():
        if len(set(ids)) != len(ids):
            problems.append(f"{claim.source} lists a {resource} device twice: {list(ids)}")
            devices[resource] = tuple(dict.fromkeys(ids))
    share = {r: s for r, s in sorted(claim.share.items()) if r in devices}
    tiles: dict[str, tuple[str, ...]] = {}
    for resource, s in share.items():
        if not s.tiles:
            continue
        ids = tuple(str(t) for t in claim.tiles.get(resource, ()))
        try:
            parsed = capacity.parse_tile_ids(ids)
        except ValueError as exc:
            problems.append(f"{claim.source}: {exc} (its tiles are not held)")
            continue
        stray = sorted(set(parsed) - set(devices[resource]))
        if stray or not ids:
            problems.append(f"{claim.source} claims {resource} tiles {list(ids)} that do not match its "
                            f"devices {list(devices[resource])}")
        tiles[resource] = tuple(t for t in ids if t.rpartition(".")[0] in devices[resource])
    if info is None:
        problems.append(f"{claim.source} claims devices on unknown node {claim.node} (kept held)")
    else:
        for resource, ids in devices.items():
            unknown = [d for d in ids if d not in info.devices.get(resource, ())]
            if unknown:
                problems.append(f"{claim.source} claims {resource} {unknown} that node {claim.node} "
                                "does not offer (kept held)")
    return Allocation(claim.group, claim.node, devices, AllocationState.COMMITTED, share, tiles)


def conflicts(
    held: Mapping[tuple[str, str, str], tuple[GroupKey, ...]],
    uses: Mapping[tuple[str, str, str], capacity.DeviceUse],
    info: Mapping[str, inventory.NodeInfo],
) -> tuple[ClaimConflict, ...]:
    """Devices held against the rules: held whole twice, used whole and in parts, over capacity."""
    out = []
    for key in sorted(set(held) | set(uses)):
        whole = held.get(key, ())
        use = uses.get(key)
        if use is None:
            if len(whole) > 1:
                out.append(ClaimConflict(*key, tuple(sorted(whole))))
            continue
        node = info.get(key[0])
        if node is None:  # problems() reports the unknown node; only the kinds can be judged
            problem = "used both whole and in parts" if whole or use.kind is None else None
        else:
            problem = capacity.overcommit(
                use, node.device_memory.get(key[1]), node.device_tiles.get(key[1], 0), bool(whole)
            )
        if problem:
            out.append(ClaimConflict(*key, tuple(sorted({*whole, *use.groups})), problem))
    return tuple(out)
