"""The device ledger: the one authority on which group holds which device on which node.

It follows the DRA scheduler's discipline: a placement is decided on an immutable
:class:`LedgerSnapshot`, then *reserved* here (in flight), *committed* once the group's status
is persisted, and *released* when the group is gone. Every change bumps ``revision``, so a
decision taken on an older snapshot can tell that the world moved and retry.

Invariant, always: a device ID on a node is never given to a second group. The one way two
groups can hold the same device is :meth:`DeviceLedger.rebuild` finding it already so in the
API; then both keep it, it is reported, and nobody else gets it until both released it.

The ledger also keeps, per device resource, an index of *open* nodes (shared, ready, not
cordoned, valid inventory) by their number of free devices, so placement can walk nodes in
score order instead of scanning the cluster.
"""

from __future__ import annotations

import bisect
import enum
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from deviceshare.core import inventory

GroupKey = inventory.GroupKey
PodKey = inventory.PodKey


class AllocationState(enum.Enum):
    RESERVED = "reserved"  # decided and held, not yet persisted in the group's status
    COMMITTED = "committed"  # persisted in the API


@dataclass(frozen=True, slots=True)
class Allocation:
    group: GroupKey
    node: str
    devices: Mapping[str, tuple[str, ...]]
    state: AllocationState


class DeviceConflict(Exception):
    """A requested device is held by another group, or the node does not offer it."""

    def __init__(
        self, node: str, resource: str, device: str, holder: GroupKey | None, detail: str = ""
    ) -> None:
        self.node, self.resource, self.device, self.holder = node, resource, device, holder
        if not detail:
            detail = (
                f"held by group {holder[0]}/{holder[1]}" if holder else "not offered by the node's inventory"
            )
        super().__init__(f"device {resource}={device} on node {node}: {detail}")


@dataclass(frozen=True, slots=True)
class Claim:
    """A group's devices as the API shows them (its status, or a member pod's annotation)."""

    group: GroupKey
    node: str
    devices: Mapping[str, Sequence[str]]
    source: str  # "status of ml/trainer" (wins over pods) or "pod ml/trainer-0"

    @property
    def from_status(self) -> bool:
        return self.source.startswith("status")


@dataclass(frozen=True, slots=True)
class ClaimConflict:
    node: str
    resource: str
    device: str
    groups: tuple[GroupKey, ...]


@dataclass(frozen=True, slots=True)
class RebuildReport:
    allocations: int
    conflicts: tuple[ClaimConflict, ...]
    problems: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node as placement sees it: inventory, free devices (inventory order), pod usage."""

    info: inventory.NodeInfo
    free: Mapping[str, tuple[str, ...]]
    cpu_used: int
    memory_used: int


@dataclass(frozen=True, slots=True)
class LedgerSnapshot:
    """An immutable view of the ledger at one revision: all placement reads."""

    revision: int
    nodes: NodeStates
    # resource -> free device count -> names of open nodes with that many free, sorted
    index: Mapping[str, Mapping[int, tuple[str, ...]]]
    _counts: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False, compare=False)

    def candidates(self, resource: str, need: int, descending: bool = False) -> Iterator[str]:
        """Open nodes with at least ``need`` free devices: by free count, then by name."""
        buckets = self.index.get(resource)
        if not buckets:
            return
        counts = self._counts.get(resource)
        if counts is None:
            counts = self._counts[resource] = tuple(sorted(buckets))
        start = bisect.bisect_left(counts, need)
        for count in (reversed(counts[start:]) if descending else counts[start:]):
            yield from buckets[count]

    def candidate_states(self, resource: str, need: int, descending: bool = False) -> Iterator[NodeState]:
        """Like :meth:`candidates`, the node states themselves (the placement hot loop)."""
        shards = self.nodes.shards
        for name in self.candidates(resource, need, descending):
            yield shards[hash(name) % _SHARDS][name]

    def candidate_count(self, resource: str, need: int) -> int:
        return sum(len(names) for count, names in self.index.get(resource, {}).items() if count >= need)


_SHARDS = 64


class NodeStates(Mapping[str, NodeState]):
    """Node states split in shards, so a snapshot shares them and a write copies one shard only.

    Copying one dict of 5,000 nodes per decision would dominate a placement; copy-on-write per
    shard keeps snapshots O(shards) and a write O(nodes / shards).
    """

    __slots__ = ("_shards",)

    def __init__(self, shards: tuple[dict[str, NodeState], ...]) -> None:
        self._shards = shards

    @property
    def shards(self) -> tuple[dict[str, NodeState], ...]:
        return self._shards

    def __getitem__(self, name: str) -> NodeState:
        return self._shards[hash(name) % _SHARDS][name]

    def get(self, name: str, default: object = None) -> Any:
        return self._shards[hash(name) % _SHARDS].get(name, default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._shards[hash(name) % _SHARDS]

    def __iter__(self) -> Iterator[str]:
        for shard in self._shards:
            yield from shard

    def __len__(self) -> int:
        return sum(len(shard) for shard in self._shards)

    def values(self) -> Any:
        return (state for shard in self._shards for state in shard.values())


def _normalized(devices: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
    return {str(r): tuple(str(d) for d in ids) for r, ids in sorted(devices.items())}


def _key(group: GroupKey) -> str:
    return f"{group[0]}/{group[1]}"


class DeviceLedger:
    """Authority on who holds which device.

    One lock around every method; ``revision`` bumps on every change.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._revision = 0
        self._info: dict[str, inventory.NodeInfo] = {}
        self._shards: list[dict[str, NodeState]] = [{} for _ in range(_SHARDS)]
        self._shared: list[bool] = [False] * _SHARDS  # shard is referenced by a snapshot: copy before writing
        self._held: dict[tuple[str, str, str], tuple[GroupKey, ...]] = {}
        self._allocs: dict[GroupKey, Allocation] = {}
        self._pods: dict[PodKey, tuple[str, int, int]] = {}
        self._used: dict[str, tuple[int, int]] = {}
        self._index: dict[str, dict[int, tuple[str, ...]]] = {}
        self._indexed: dict[str, dict[str, int]] = {}  # node -> resource -> count it is filed under
        self._snapshot: LedgerSnapshot | None = None

    @property
    def revision(self) -> int:
        return self._revision

    # --- inventory and non-device usage ---------------------------------------------------------

    def upsert_node(self, node: inventory.NodeInfo) -> None:
        """Add or replace a node. Held devices that vanish from its inventory stay held (see problems())."""
        with self._lock:
            if self._info.get(node.name) == node:
                return
            self._info[node.name] = node
            self._refresh(node.name)
            self._revision += 1

    def remove_node(self, name: str) -> None:
        """Forget a node; allocations on it stay recorded until released."""
        with self._lock:
            if self._info.pop(name, None) is None:
                return
            self._refresh(name)
            self._revision += 1

    def node(self, name: str) -> inventory.NodeInfo | None:
        with self._lock:
            return self._info.get(name)

    def nodes(self) -> list[inventory.NodeInfo]:
        with self._lock:
            return [self._info[n] for n in sorted(self._info)]

    def account_pod(self, pod: PodKey, node: str, cpu_milli: int, memory_bytes: int) -> None:
        """Record the cpu/memory a pod bound to ``node`` requests (any scheduler's pods); idempotent."""
        with self._lock:
            entry = (node, cpu_milli, memory_bytes)
            previous = self._pods.get(pod)
            if previous == entry:
                return
            if previous is not None:
                self._add_usage(previous[0], -previous[1], -previous[2])
            self._pods[pod] = entry
            self._add_usage(node, cpu_milli, memory_bytes)
            self._revision += 1

    def forget_pod(self, pod: PodKey) -> None:
        with self._lock:
            previous = self._pods.pop(pod, None)
            if previous is None:
                return
            self._add_usage(previous[0], -previous[1], -previous[2])
            self._revision += 1

    def used(self, node: str) -> tuple[int, int]:
        """(cpu_milli, memory_bytes) requested by the accounted pods on ``node``."""
        with self._lock:
            return self._used.get(node, (0, 0))

    def _add_usage(self, node: str, cpu: int, memory: int) -> None:
        old_cpu, old_mem = self._used.get(node, (0, 0))
        new = (old_cpu + cpu, old_mem + memory)
        if new == (0, 0):
            self._used.pop(node, None)
        else:
            self._used[node] = new
        self._refresh(node)

    # --- devices ----------------------------------------------------------------------------------

    def reserve(self, group: GroupKey, node: str, devices: Mapping[str, Sequence[str]]) -> Allocation:
        """Hold devices for a group (in flight); idempotent for the same devices; one allocation per group."""
        wanted = _normalized(devices)
        for resource, ids in wanted.items():
            if len(set(ids)) != len(ids):
                raise ValueError(f"device IDs of {resource} repeat: {list(ids)}")
        with self._lock:
            existing = self._allocs.get(group)
            if existing is not None:
                if existing.node == node and dict(existing.devices) == wanted:
                    return existing
                resource, ids = next(iter(existing.devices.items()), ("", ()))
                raise DeviceConflict(
                    existing.node, resource, ids[0] if ids else "", group,
                    f"group {_key(group)} already holds devices on node {existing.node}; release them first",
                )
            info = self._info.get(node)
            for resource, ids in wanted.items():
                offered = info.devices.get(resource, ()) if info is not None else ()
                for device in ids:
                    if device not in offered:
                        detail = "" if info is not None else "node is not in the inventory"
                        raise DeviceConflict(node, resource, device, None, detail)
                    holders = self._held.get((node, resource, device))
                    if holders:
                        raise DeviceConflict(node, resource, device, holders[0])
            allocation = Allocation(group, node, wanted, AllocationState.RESERVED)
            self._hold(allocation)
            self._refresh(node)
            self._revision += 1
            return allocation

    def commit(self, group: GroupKey) -> Allocation:
        """Mark a reservation persisted in the API. KeyError if the group holds nothing."""
        with self._lock:
            existing = self._allocs[group]
            if existing.state is AllocationState.COMMITTED:
                return existing
            committed = Allocation(existing.group, existing.node, existing.devices, AllocationState.COMMITTED)
            self._allocs[group] = committed
            self._revision += 1
            return committed

    def release(self, group: GroupKey) -> Allocation | None:
        """Give a group's devices back; a device still claimed by another group stays held by it."""
        with self._lock:
            existing = self._allocs.pop(group, None)
            if existing is None:
                return None
            for resource, ids in existing.devices.items():
                for device in ids:
                    key = (existing.node, resource, device)
                    rest = tuple(g for g in self._held.get(key, ()) if g != group)
                    if rest:
                        self._held[key] = rest
                    else:
                        self._held.pop(key, None)
            self._refresh(existing.node)
            self._revision += 1
            return existing

    def allocation(self, group: GroupKey) -> Allocation | None:
        with self._lock:
            return self._allocs.get(group)

    def allocations(self) -> list[Allocation]:
        with self._lock:
            return [self._allocs[g] for g in sorted(self._allocs)]

    def holder(self, node: str, resource: str, device: str) -> GroupKey | None:
        """The group holding a device; for a contested device (see rebuild) the first claimant."""
        with self._lock:
            holders = self._held.get((node, resource, device))
            return holders[0] if holders else None

    def holders(self, node: str, resource: str, device: str) -> tuple[GroupKey, ...]:
        with self._lock:
            return self._held.get((node, resource, device), ())

    def free_devices(self, node: str, resource: str) -> tuple[str, ...]:
        with self._lock:
            state = self._shards[hash(node) % _SHARDS].get(node)
            return state.free.get(resource, ()) if state is not None else ()

    def capacity(self, node: str, resource: str) -> int:
        with self._lock:
            info = self._info.get(node)
            return len(info.devices.get(resource, ())) if info is not None else 0

    def contested(self) -> tuple[ClaimConflict, ...]:
        """Devices held by more than one group right now (only ever the result of a rebuild)."""
        with self._lock:
            return tuple(
                ClaimConflict(node, resource, device, groups)
                for (node, resource, device), groups in sorted(self._held.items())
                if len(groups) > 1
            )

    def problems(self) -> tuple[str, ...]:
        """Held devices the inventory no longer (or never) offered: kept held, never re-given."""
        with self._lock:
            found = []
            for (node, resource, device), groups in sorted(self._held.items()):
                info = self._info.get(node)
                if info is None:
                    found.append(f"{resource}={device} on unknown node {node} is held by "
                                 + ", ".join(_key(g) for g in groups))
                elif device not in info.devices.get(resource, ()):
                    found.append(f"{resource}={device} held by {', '.join(_key(g) for g in groups)} "
                                 f"is not in node {node}'s inventory")
            return tuple(found)

    def rebuild(self, claims: Iterable[Claim]) -> RebuildReport:
        """Replace all device state with committed allocations read back from the API.

        Conflicts are reported, never resolved by picking a winner: every claimant of a contested
        device keeps it, and it is free again only once all of them released it. A group's status
        beats its pods' annotations when they disagree (reported). Claims on unknown nodes or
        devices are kept held and reported. Reservations in flight are dropped.
        """
        problems: list[str] = []
        chosen: dict[GroupKey, Claim] = {}
        for claim in claims:
            current = chosen.get(claim.group)
            if current is None:
                chosen[claim.group] = claim
                continue
            same = current.node == claim.node and _normalized(current.devices) == _normalized(claim.devices)
            if same:
                continue
            status_wins = claim.from_status and not current.from_status
            winner, loser = (claim, current) if status_wins else (current, claim)
            chosen[claim.group] = winner
            problems.append(
                f"group {_key(claim.group)}: {loser.source} says node {loser.node} "
                f"{_render(loser.devices)} but {winner.source} says node {winner.node} "
                f"{_render(winner.devices)}; using {winner.source}"
            )
        with self._lock:
            touched = {a.node for a in self._allocs.values()}
            self._held.clear()
            self._allocs.clear()
            for group in sorted(chosen):
                claim = chosen[group]
                devices = _normalized(claim.devices)
                for resource, ids in devices.items():
                    if len(set(ids)) != len(ids):
                        problems.append(f"{claim.source} lists a {resource} device twice: {list(ids)}")
                        devices[resource] = tuple(dict.fromkeys(ids))
                info = self._info.get(claim.node)
                if info is None:
                    problems.append(f"{claim.source} claims devices on unknown node {claim.node} (kept held)")
                else:
                    for resource, ids in devices.items():
                        unknown = [d for d in ids if d not in info.devices.get(resource, ())]
                        if unknown:
                            problems.append(
                                f"{claim.source} claims {resource} {unknown} that node {claim.node} "
                                "does not offer (kept held)"
                            )
                self._hold(Allocation(group, claim.node, devices, AllocationState.COMMITTED))
                touched.add(claim.node)
            for name in touched | {n for shard in self._shards for n in shard}:
                self._refresh(name)
            self._revision += 1
            conflicts = tuple(
                ClaimConflict(node, resource, device, tuple(sorted(groups)))
                for (node, resource, device), groups in sorted(self._held.items())
                if len(groups) > 1
            )
            return RebuildReport(allocations=len(self._allocs), conflicts=conflicts, problems=tuple(problems))

    def snapshot(self) -> LedgerSnapshot:
        """An immutable view for placement; the same object while the revision stays put."""
        with self._lock:
            snap = self._snapshot
            if snap is None or snap.revision != self._revision:
                snap = LedgerSnapshot(
                    revision=self._revision,
                    nodes=NodeStates(tuple(self._shards)),
                    index={r: dict(b) for r, b in self._index.items()},
                )
                self._snapshot = snap
                self._shared = [True] * _SHARDS
            return snap

    # --- internals ------------------------------------------------------------------------------

    def _hold(self, allocation: Allocation) -> None:
        self._allocs[allocation.group] = allocation
        for resource, ids in allocation.devices.items():
            for device in ids:
                key = (allocation.node, resource, device)
                self._held[key] = (*self._held.get(key, ()), allocation.group)

    def _refresh(self, name: str) -> None:
        """Recompute one node's state and its place in the free-capacity index."""
        info = self._info.get(name)
        i = hash(name) % _SHARDS
        if self._shared[i]:
            self._shards[i] = dict(self._shards[i])
            self._shared[i] = False
        if info is None:
            self._shards[i].pop(name, None)
            self._file(name, {})
            return
        held = self._held
        free = {
            resource: tuple(d for d in ids if (name, resource, d) not in held)
            for resource, ids in info.devices.items()
        }
        cpu, memory = self._used.get(name, (0, 0))
        self._shards[i][name] = NodeState(info, free, cpu, memory)
        is_open = info.shared and info.ready and not info.unschedulable and not info.problems
        self._file(name, {r: len(ids) for r, ids in free.items() if ids} if is_open else {})

    def _file(self, name: str, counts: dict[str, int]) -> None:
        previous = self._indexed.get(name, {})
        if previous == counts:
            return
        for resource, count in previous.items():
            if counts.get(resource) != count:
                buckets = self._index[resource]
                bucket = buckets[count]
                i = bisect.bisect_left(bucket, name)
                rest = bucket[:i] + bucket[i + 1:]
                if rest:
                    buckets[count] = rest
                else:
                    del buckets[count]
                    if not buckets:
                        del self._index[resource]
        for resource, count in counts.items():
            if previous.get(resource) != count:
                buckets = self._index.setdefault(resource, {})
                bucket = buckets.get(count, ())
                i = bisect.bisect_left(bucket, name)
                buckets[count] = (*bucket[:i], name, *bucket[i:])
        if counts:
            self._indexed[name] = counts
        else:
            self._indexed.pop(name, None)


def _render(devices: Mapping[str, Sequence[str]]) -> str:
    return "{" + ", ".join(f"{r}: {','.join(ids)}" for r, ids in sorted(devices.items())) + "}"
