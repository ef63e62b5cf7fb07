"""The device ledger: the one authority on which group holds which device (or part of it) on which node.

It follows the DRA scheduler's discipline: a placement is decided on an immutable
:class:`LedgerSnapshot`, then *reserved* here (in flight), *committed* once the group's status
is persisted, and *released* when the group is gone. Every change bumps ``revision``, so a
decision taken on an older snapshot can tell that the world moved and retry.

Invariant, always: a device is held whole by one group, **or** shared by compute/memory sharers
within its capacity, **or** split in tiles each held by one group (CONTRACT §7), one kind at a
time. The one way this can be broken is :meth:`DeviceLedger.rebuild` finding it already so in the
API; then every claimant keeps what it claimed, it is reported, and nobody else gets the device
(or any more of it) until they released it. Like the DRA allocator, the ledger keeps the parts a
shared device gave out (and their sums) beside the wholly held devices; the rules over those two
maps (what a reservation must pass, what a node has left) are in ``holdings``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

from deviceshare.core import capacity, claims, filterclasses, holdings, inventory, podusage, snapshots

GroupKey = inventory.GroupKey
PodKey = inventory.PodKey
# Re-exported: what callers have always found here.
Claim = claims.Claim
ClaimConflict = claims.ClaimConflict
RebuildReport = claims.RebuildReport
NodeState = snapshots.NodeState
LedgerSnapshot = snapshots.LedgerSnapshot
NodeStates = snapshots.NodeStates
ChangedNodes = snapshots.ChangedNodes
_SHARDS = snapshots.SHARDS
AllocationState = claims.AllocationState
Allocation = claims.Allocation
DeviceConflict = claims.DeviceConflict
DeviceKey = holdings.DeviceKey


class DeviceLedger:
    """Authority on who holds which device. One lock around every method; ``revision`` bumps on every change."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._revision = 0
        self._info: dict[str, inventory.NodeInfo] = {}
        self._shards: list[dict[str, NodeState]] = [{} for _ in range(_SHARDS)]
        self._shared: list[bool] = [False] * _SHARDS  # shard is referenced by a snapshot: copy before writing
        self._held: holdings.Held = {}  # whole holders
        self._uses: holdings.Uses = {}  # devices given out in parts
        self._allocs: dict[GroupKey, Allocation] = {}
        self._usage = podusage.PodUsage()  # cpu/memory the accounted pods request, per node
        self._indexes = snapshots.Indexes()
        self._filter_classes = filterclasses.FilterClasses()
        self._snapshot: LedgerSnapshot | None = None
        self._linked: set[str] = set()  # nodes that report a device topology
        self._subscribers: list[Callable[[str, NodeState | None], None]] = []

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
            if node.topology:
                self._linked.add(node.name)
            else:
                self._linked.discard(node.name)
            self._refresh(node.name)
            self._revision += 1

    def remove_node(self, name: str) -> None:
        """Forget a node; allocations on it stay recorded until released."""
        with self._lock:
            if self._info.pop(name, None) is None:
                return
            self._linked.discard(name)
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
        self.account_pods([(pod, node, cpu_milli, memory_bytes)])

    def account_pods(self, pods: Iterable[tuple[PodKey, str, int, int]]) -> None:
        """:meth:`account_pod` for many (pod, node, cpu_milli, memory_bytes) at once: each node's state is
        recomputed once, not once per pod (a rebuild accounts 10,000 pods on 500 nodes)."""
        with self._lock:
            touched = self._usage.account(pods)
            for node in touched:
                self._refresh(node)
            if touched:
                self._revision += 1

    def forget_pod(self, pod: PodKey) -> None:
        with self._lock:
            node = self._usage.forget(pod)
            if node is None:
                return
            self._refresh(node)
            self._revision += 1

    def used(self, node: str) -> tuple[int, int]:
        """(cpu_milli, memory_bytes) requested by the accounted pods on ``node``."""
        with self._lock:
            return self._usage.on(node)

    # --- devices ----------------------------------------------------------------------------------

    def reserve(
        self,
        group: GroupKey,
        node: str,
        devices: Mapping[str, Sequence[str]],
        share: Mapping[str, capacity.Share] | None = None,
        tiles: Mapping[str, Sequence[str]] | None = None,
    ) -> Allocation:
        """Hold devices (whole, or the given share of each) for a group, in flight.

        Idempotent for the same request; one allocation per group. ``tiles`` names the tiles of a
        tile share as ``<device>.<tile>``. Raises DeviceConflict when a device cannot take it.
        """
        wanted, shares, wanted_tiles, per_device = claims.requested(devices, share, tiles)
        with self._lock:
            existing = self._allocs.get(group)
            if existing is not None:
                same = (existing.node, dict(existing.devices), dict(existing.share), dict(existing.tiles))
                if same == (node, wanted, shares, wanted_tiles):
                    return existing
                raise claims.already_holds(existing, group)
            holdings.check_reservable(self._held, self._uses, node, self._info.get(node), wanted, shares, per_device)
            allocation = Allocation(group, node, wanted, AllocationState.RESERVED, shares, wanted_tiles)
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
            committed = claims.committed(existing)
            self._allocs[group] = committed
            self._revision += 1
            return committed

    def release(self, group: GroupKey) -> Allocation | None:
        """Give a group's devices (or its parts of them) back; other claimants keep theirs."""
        with self._lock:
            existing = self._allocs.pop(group, None)
            if existing is None:
                return None
            holdings.release(self._held, self._uses, existing)
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
        """A group holding (a part of) a device; for a contested device (see rebuild) the first claimant."""
        holders = self.holders(node, resource, device)
        return holders[0] if holders else None

    def holders(self, node: str, resource: str, device: str) -> tuple[GroupKey, ...]:
        """Every group holding the device or a part of it: whole holders first, then sharers by name."""
        with self._lock:
            return holdings.holders(self._held, self._uses, (node, resource, device))

    def use(self, node: str, resource: str, device: str) -> capacity.DeviceUse | None:
        """The parts a device has given out to sharing groups; None if none."""
        with self._lock:
            return self._uses.get((node, resource, device))

    def shared_usage(self, node: str, resource: str) -> tuple[int, int]:
        """(compute milli, memory bytes) given out to sharing groups on a node's devices of ``resource``."""
        with self._lock:
            info = self._info.get(node)
            uses = [self._uses.get((node, resource, d)) for d in (info.devices.get(resource, ()) if info else ())]
            return (sum(u.compute_milli for u in uses if u), sum(u.memory_bytes for u in uses if u))

    def free_devices(self, node: str, resource: str) -> tuple[str, ...]:
        """Devices nobody holds, whole or in part."""
        with self._lock:
            state = self._shards[hash(node) % _SHARDS].get(node)
            return state.free.get(resource, ()) if state is not None else ()

    def capacity(self, node: str, resource: str) -> int:
        with self._lock:
            info = self._info.get(node)
            return len(info.devices.get(resource, ())) if info is not None else 0

    def contested(self) -> tuple[ClaimConflict, ...]:
        """Devices held against the rules right now (only ever the result of a rebuild)."""
        with self._lock:
            return self._conflicts()

    def problems(self) -> tuple[str, ...]:
        """Held devices the inventory no longer (or never) offered: kept held, never re-given."""
        with self._lock:
            return holdings.problems(self._held, self._uses, self._info)

    def rebuild(self, claimed: Iterable[Claim]) -> RebuildReport:
        """Replace all device state with committed allocations read back from the API.

        Conflicts (a device held twice, used whole and in parts, shares over its capacity, a tile
        held twice) are reported, never resolved by picking a winner: every claimant keeps what it
        claimed, and the device is free again only once all of them released it. A group's status
        beats its pods' annotations when they disagree (reported). Claims on unknown nodes or
        devices are kept held and reported. Reservations in flight are dropped.
        """
        problems: list[str] = []
        chosen = claims.choose(claimed, problems)
        with self._lock:
            touched = {a.node for a in self._allocs.values()}
            self._held.clear()
            self._uses.clear()
            self._allocs.clear()
            for group in sorted(chosen):
                self._hold(claims.as_allocation(chosen[group], self._info.get(chosen[group].node), problems))
                touched.add(chosen[group].node)
            for name in touched | {n for shard in self._shards for n in shard}:
                self._refresh(name)
            self._revision += 1
            return RebuildReport(len(self._allocs), self._conflicts(), tuple(problems))

    def subscribe(self, on_node: Callable[[str, NodeState | None], None]) -> None:
        """Call ``on_node(name, state)`` for every node now, then after each change (None: gone), under the lock."""
        with self._lock:
            self._subscribers.append(on_node)
            for shard in self._shards:
                for name, state in shard.items():
                    on_node(name, state)

    def snapshot(self) -> LedgerSnapshot:
        """An immutable view for placement; the same object while the revision stays put."""
        with self._lock:
            snap = self._snapshot
            if snap is None or snap.revision != self._revision:
                snap = LedgerSnapshot(
                    revision=self._revision,
                    nodes=NodeStates(tuple(self._shards)),
                    index=self._indexes.free_copy(),
                    parts=self._indexes.parts_copy(),
                    linked_nodes=len(self._linked),
                    filter_classes=self._filter_classes,
                )
                self._snapshot = snap
                self._shared = [True] * _SHARDS
            return snap

    # --- internals ------------------------------------------------------------------------------

    def _conflicts(self) -> tuple[ClaimConflict, ...]:
        return claims.conflicts(self._held, self._uses, self._info)

    def _hold(self, allocation: Allocation) -> None:
        self._allocs[allocation.group] = allocation
        holdings.hold(self._held, self._uses, allocation)

    def _refresh(self, name: str) -> None:
        """Recompute one node's state and its place in the free-capacity indexes; tell the subscribers."""
        info = self._info.get(name)
        i = hash(name) % _SHARDS
        if self._shared[i]:
            self._shards[i] = dict(self._shards[i])
            self._shared[i] = False
        state: NodeState | None = None
        if info is None:
            self._shards[i].pop(name, None)
            self._indexes.file(name, {}, frozenset())
        else:
            free, partial = holdings.left_on(name, info, self._held, self._uses)
            cpu, memory = self._usage.on(name)
            state = self._shards[i][name] = NodeState(info, free, cpu, memory, partial)
            self._indexes.file(name, *snapshots.index_entries(info, free, partial))
        for on_node in self._subscribers:
            on_node(name, state)
