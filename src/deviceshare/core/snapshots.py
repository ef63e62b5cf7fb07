"""What placement reads: an immutable :class:`LedgerSnapshot` of node states and free-capacity indexes.

The ledger keeps two indexes of *open* nodes (shared, ready, not cordoned, valid inventory) so a
decision walks candidates in score order instead of scanning the cluster:

- ``index``: resource -> number of wholly free devices -> node names (whole-device groups, and
  sharing groups that start a fresh device);
- ``parts``: (resource, dimension) -> amount left -> (node, device) of devices in partial use,
  the dimension being ``compute`` (milli), ``memory`` (bytes) or ``tiles`` (free tiles). Binpack
  walks it upwards from what a share needs (tightest fit first), spread downwards.

Buckets are sorted tuples shared between snapshots; the ledger replaces, never mutates, them.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from deviceshare.core import capacity, inventory

if TYPE_CHECKING:
    from deviceshare.core.filterclasses import FilterClasses

SHARDS = 64
COMPUTE, MEMORY, TILES = "compute", "memory", "tiles"
PartKey = tuple[str, str]  # (resource, dimension)
Entry = tuple[str, str]  # (node, device)


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node as placement sees it: inventory, free devices (inventory order), pod usage.

    ``partial``: per resource, the devices in partial use that may still take sharers of their
    kind, in inventory order (devices a rebuild found mixed are in neither ``free`` nor here).
    """

    info: inventory.NodeInfo
    free: Mapping[str, tuple[str, ...]]
    cpu_used: int
    memory_used: int
    partial: Mapping[str, tuple[capacity.DeviceLeft, ...]] = field(default_factory=dict)


def dimension(share: capacity.Share) -> str:
    """The index a share is placed by (see :func:`capacity.key`)."""
    return TILES if share.tiles else COMPUTE if share.compute_milli else MEMORY


def need(share: capacity.Share) -> int:
    return share.tiles or share.compute_milli or share.memory_bytes


def _sorted_keys(cache: dict[Any, tuple[int, ...]], key: Any, buckets: Mapping[int, Any]) -> tuple[int, ...]:
    keys = cache.get(key)
    if keys is None:
        keys = cache[key] = tuple(sorted(buckets))
    return keys


@dataclass(frozen=True, slots=True)
class LedgerSnapshot:
    """An immutable view of the ledger at one revision: all placement reads."""

    revision: int
    nodes: NodeStates
    # resource -> free device count -> names of open nodes with that many free, sorted
    index: Mapping[str, Mapping[int, tuple[str, ...]]]
    parts: Mapping[PartKey, Mapping[int, tuple[Entry, ...]]] = field(default_factory=dict)
    linked_nodes: int = 0  # nodes that report how their devices are linked (CONTRACT §9; see linkscore)
    # the ledger's nodes grouped by what the filters read (one object for all its snapshots): how placement
    # counts why nothing fits without asking every node (None: node by node)
    filter_classes: FilterClasses | None = field(default=None, repr=False, compare=False)
    _counts: dict[Any, tuple[int, ...]] = field(default_factory=dict, repr=False, compare=False)

    def candidates(self, resource: str, need: int, descending: bool = False) -> Iterator[str]:
        """Open nodes with at least ``need`` free devices: by free count, then by name."""
        buckets = self.index.get(resource)
        if not buckets:
            return
        counts = _sorted_keys(self._counts, resource, buckets)
        start = bisect.bisect_left(counts, need)
        for count in (reversed(counts[start:]) if descending else counts[start:]):
            yield from buckets[count]

    def candidate_states(self, resource: str, need: int, descending: bool = False) -> Iterator[NodeState]:
        """Like :meth:`candidates`, the node states themselves (the placement hot loop)."""
        shards = self.nodes.shards
        for name in self.candidates(resource, need, descending):
            yield shards[hash(name) % SHARDS][name]

    def candidate_count(self, resource: str, need: int) -> int:
        return sum(len(names) for count, names in self.index.get(resource, {}).items() if count >= need)

    def part_candidates(
        self, resource: str, dim: str, need: int, descending: bool = False
    ) -> Iterator[tuple[int, Entry]]:
        """(amount left, (node, device)) of partly used devices with at least ``need`` left."""
        buckets = self.parts.get((resource, dim))
        if not buckets:
            return
        keys = _sorted_keys(self._counts, (resource, dim), buckets)
        start = bisect.bisect_left(keys, need)
        for left in (reversed(keys[start:]) if descending else keys[start:]):
            for entry in buckets[left]:
                yield left, entry


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
        return self._shards[hash(name) % SHARDS][name]

    def get(self, name: str, default: object = None) -> Any:
        return self._shards[hash(name) % SHARDS].get(name, default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._shards[hash(name) % SHARDS]

    def __iter__(self) -> Iterator[str]:
        for shard in self._shards:
            yield from shard

    def __len__(self) -> int:
        return sum(len(shard) for shard in self._shards)

    def values(self) -> Any:
        return (state for shard in self._shards for state in shard.values())


class Follower:
    """Which nodes changed in the ledger's snapshots since the last look, at the cost of what changed.

    The ledger copies a shard before it writes to it (:class:`NodeStates`), so a shard object seen before
    is unchanged: only the nodes of new shards are compared, by identity. What indexes of the ledger's
    nodes kept outside it (:mod:`fgdindex`, :mod:`filterclasses`, :mod:`victimindex`) catch up with.
    """

    def __init__(self) -> None:
        self._shards: list[Mapping[str, NodeState] | None] = [None] * SHARDS
        self.states: dict[str, NodeState] = {}  # every node of the last snapshot looked at

    def changes(self, snapshot: LedgerSnapshot) -> list[tuple[str, NodeState | None]]:
        """(name, state) of the nodes new or changed since the last call, (name, None) of those gone."""
        states = self.states
        out: list[tuple[str, NodeState | None]] = []
        for i, shard in enumerate(snapshot.nodes.shards):
            old = self._shards[i]
            if shard is old:
                continue
            for name, state in shard.items():
                if states.get(name) is not state:
                    states[name] = state
                    out.append((name, state))
            if old is not None and old.keys() != shard.keys():  # nodes left (a set comparison, in C)
                for name in old.keys() - shard.keys():
                    del states[name]
                    out.append((name, None))
            self._shards[i] = shard
        return out


class ChangedNodes(set[str]):
    """The names of the ledger's nodes changed since the last :meth:`take`: a subscriber
    (``ledger.subscribe(changed)``) whose calls stay in the core, for a reader outside it that catches up
    when it looks (preemption's victim index, the node metrics) instead of being called on every change."""

    def __call__(self, name: str, state: NodeState | None) -> None:
        self.add(name)

    def take(self) -> set[str]:
        taken = set(self)
        self.clear()
        return taken


def bucket_remove(buckets: dict[int, tuple[Any, ...]], key: int, item: Any) -> None:
    """Take ``item`` out of the sorted bucket ``key`` (a new tuple: snapshots hold the old one)."""
    bucket = buckets[key]
    i = bisect.bisect_left(bucket, item)
    rest = bucket[:i] + bucket[i + 1:]
    if rest:
        buckets[key] = rest
    else:
        del buckets[key]


def bucket_add(buckets: dict[int, tuple[Any, ...]], key: int, item: Any) -> None:
    bucket = buckets.get(key, ())
    i = bisect.bisect_left(bucket, item)
    buckets[key] = (*bucket[:i], item, *bucket[i:])


def index_entries(
    info: inventory.NodeInfo,
    free: Mapping[str, tuple[str, ...]],
    partial: Mapping[str, tuple[capacity.DeviceLeft, ...]],
) -> tuple[dict[str, int], frozenset[tuple[str, str, int, str]]]:
    """What a node files in the two indexes: its wholly free devices counted, and its parts left
    (:func:`part_entries`); nothing unless the node is open (shared, ready, not cordoned, valid inventory)."""
    if not (info.shared and info.ready and not info.unschedulable and not info.problems):
        return {}, frozenset()
    return {r: len(ids) for r, ids in free.items() if ids}, part_entries(partial)


def part_entries(partial: Mapping[str, tuple[capacity.DeviceLeft, ...]]) -> frozenset[tuple[str, str, int, str]]:
    """Index entries (resource, dimension, amount left, device) of the devices that can take more."""
    out = []
    for resource, lefts in partial.items():
        for left in lefts:
            if left.kind is capacity.Kind.TILES:
                if left.free_tiles:
                    out.append((resource, TILES, len(left.free_tiles), left.device))
                continue
            if left.compute_milli > 0:
                out.append((resource, COMPUTE, left.compute_milli, left.device))
            if left.memory_bytes is not None and left.memory_bytes > 0:
                out.append((resource, MEMORY, left.memory_bytes, left.device))
    return frozenset(out)


class Indexes:
    """The ledger's two free-capacity indexes (see the module docstring), refiled one node at a time."""

    def __init__(self) -> None:
        self._free: dict[str, dict[int, tuple[str, ...]]] = {}
        self._counts: dict[str, dict[str, int]] = {}  # node -> resource -> count it is filed under
        self._parts: dict[PartKey, dict[int, tuple[Entry, ...]]] = {}
        self._entries: dict[str, frozenset[tuple[str, str, int, str]]] = {}

    def free_copy(self) -> dict[str, dict[int, tuple[str, ...]]]:
        return {r: dict(b) for r, b in self._free.items()}

    def parts_copy(self) -> dict[PartKey, dict[int, tuple[Entry, ...]]]:
        return {k: dict(b) for k, b in self._parts.items()}

    def file(self, name: str, counts: dict[str, int], entries: frozenset[tuple[str, str, int, str]]) -> None:
        """File node ``name`` under its free device counts and its partly used devices (empty: unfile)."""
        previous = self._counts.get(name, {})
        if previous != counts:
            for resource, count in previous.items():
                if counts.get(resource) != count:
                    bucket_remove(self._free[resource], count, name)
                    if not self._free[resource]:
                        del self._free[resource]
            for resource, count in counts.items():
                if previous.get(resource) != count:
                    bucket_add(self._free.setdefault(resource, {}), count, name)
            if counts:
                self._counts[name] = counts
            else:
                self._counts.pop(name, None)
        before = self._entries.get(name, frozenset())
        if before == entries:
            return
        for resource, dim, left, device in before - entries:
            buckets = self._parts[(resource, dim)]
            bucket_remove(buckets, left, (name, device))
            if not buckets:
                del self._parts[(resource, dim)]
        for resource, dim, left, device in entries - before:
            bucket_add(self._parts.setdefault((resource, dim), {}), left, (name, device))
        if entries:
            self._entries[name] = entries
        else:
            self._entries.pop(name, None)
