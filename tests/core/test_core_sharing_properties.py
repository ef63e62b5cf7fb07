"""Properties of the ledger with fractional shares, after any sequence of operations and under threads.

- a device is used one way at a time: whole by one group, or by compute/memory sharers, or by tile
  holders (except where a rebuild found it otherwise, and then only among the claimants);
- a device's capacity is never exceeded: compute <= 1000m, memory <= the device's, a tile per group;
- what is left plus what is given out is the capacity, for every device, in every dimension;
- the indexes file exactly the open nodes' free devices and partly used devices;
- the indexed placement decides exactly as the naive scan.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from tests.core import builders
from tests.core.test_core_ledger_properties import interleaved

from deviceshare.core import capacity, inventory, ledger, placement, snapshots

GPU = builders.GPU
GI = 1 << 30
NODES = ("n0", "n1", "n2")
GROUPS = tuple(("ns", f"g{i}") for i in range(8))
ANY_POD = inventory.PodDemand()

shares = st.one_of(
    st.none(),  # whole devices
    st.builds(
        capacity.Share, st.sampled_from([0, 100, 250, 460, 500, 1000]), st.sampled_from([0, 8 * GI, 20 * GI])
    ).filter(lambda s: bool(s.compute_milli or s.memory_bytes)),
    st.builds(capacity.Share, st.just(0), st.just(0), st.integers(1, 2)),
)
device_sets = st.sets(st.sampled_from("0123"), min_size=1, max_size=2)


def node(name: str, gpus: int = 4, memory: int | None = 40 * GI, tiles: int = 2, **kw: Any) -> inventory.NodeInfo:
    return builders.node(
        name, gpus=gpus, device_memory={GPU: memory} if memory else None, device_tiles={GPU: tiles} if tiles else None,
        **kw,
    )


def check_invariants(book: ledger.DeviceLedger, contested: set[tuple[str, str, str]]) -> None:
    expected_uses: dict[tuple[str, str, str], list[tuple[tuple[str, str], capacity.Share | None, tuple[int, ...]]]]
    expected_uses = collections.defaultdict(list)
    for alloc in book.allocations():
        for resource, ids in alloc.devices.items():
            share = alloc.share.get(resource)
            tiles = capacity.parse_tile_ids(alloc.tiles.get(resource, ()))
            for device in ids:
                expected_uses[(alloc.node, resource, device)].append((alloc.group, share, tiles.get(device, ())))
    for key, parts in expected_uses.items():
        assert sorted(g for g, _, _ in parts) == sorted(book.holders(*key))
        whole = [g for g, s, _ in parts if s is None]
        kinds = {s.kind for _, s, _ in parts if s is not None}
        info = book.node(key[0])
        memory_cap = info.device_memory.get(key[1]) if info else None
        tiles_cap = info.device_tiles.get(key[1], 0) if info else 0
        compute = sum(s.compute_milli for _, s, _ in parts if s is not None and not s.tiles)
        memory = sum(s.memory_bytes for _, s, _ in parts if s is not None and not s.tiles)
        tiles = [t for _, s, ts in parts if s is not None for t in ts]
        use = book.use(*key)
        if kinds:
            assert use is not None and (use.compute_milli, use.memory_bytes) == (compute, memory)
            assert sorted(use.tiles) == sorted(tiles)
        lawful = (
            (len(whole) == 1 and not kinds)
            or (not whole and kinds == {capacity.Kind.SHARED} and compute <= 1000
                and (memory == 0 or (memory_cap is not None and memory <= memory_cap)))
            or (not whole and kinds == {capacity.Kind.TILES} and len(set(tiles)) == len(tiles)
                and all(t < tiles_cap for t in tiles))
        )
        if not lawful:
            # only a rebuild can break the rules, only on what it reported, and only among claimants
            assert key in contested, (key, parts)
    snap = book.snapshot()
    filed: set[tuple[str, str, int, str]] = set()
    for (resource, dim), buckets in snap.parts.items():
        for left, entries in buckets.items():
            assert list(entries) == sorted(entries)
            filed |= {(resource, dim, left, f"{n}/{d}") for n, d in entries}
    wanted: set[tuple[str, str, int, str]] = set()
    for info in book.nodes():
        state = snap.nodes[info.name]
        for resource, ids in info.devices.items():
            free = set(state.free.get(resource, ()))
            partial = {left.device: left for left in state.partial.get(resource, ())}
            held = {d for d in ids if (info.name, resource, d) in expected_uses}
            assert not free & held and len(free) + len(held) == len(ids)  # free + used == capacity
            assert set(partial) <= held
            memory_cap = info.device_memory.get(resource)
            for device, left in partial.items():
                use = book.use(info.name, resource, device)
                assert use is not None
                assert left.compute_milli + use.compute_milli == capacity.COMPUTE_FULL
                if memory_cap is not None:
                    assert left.memory_bytes is not None and left.memory_bytes + use.memory_bytes == memory_cap
                assert not set(left.free_tiles) & set(use.tiles)
        is_open = info.shared and info.ready and not info.unschedulable and not info.problems
        if is_open:
            entries = snapshots.part_entries(state.partial)
            wanted |= {(r, dim, left, f"{info.name}/{d}") for r, dim, left, d in entries}
    assert filed == wanted


def tiles_for(devices: list[str], share: capacity.Share | None, offset: int) -> dict[str, list[str]] | None:
    if share is None or not share.tiles:
        return None
    return {GPU: [f"{d}.{(offset + t) % 2}" for d in devices for t in range(share.tiles)]}


class ShareLedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.book = ledger.DeviceLedger()
        self.contested: set[tuple[str, str, str]] = set()
        for name in NODES:
            self.book.upsert_node(node(name))

    @rule(group=st.sampled_from(GROUPS), name=st.sampled_from(NODES), devices=device_sets, share=shares,
          offset=st.integers(0, 1))
    def reserve(self, group: tuple[str, str], name: str, devices: set[str], share: capacity.Share | None,
                offset: int) -> None:
        before = self.book.allocation(group)
        ids = sorted(devices)
        try:
            got = self.book.reserve(
                group, name, {GPU: ids}, {GPU: share} if share else None, tiles_for(ids, share, offset)
            )
        except (ledger.DeviceConflict, ValueError):
            assert self.book.allocation(group) == before
            return
        assert got.node == name and list(got.devices[GPU]) == ids

    @rule(group=st.sampled_from(GROUPS), share=shares, n=st.integers(1, 2),
          strategy=st.sampled_from(["binpack", "spread"]))
    def schedule(self, group: tuple[str, str], share: capacity.Share | None, n: int, strategy: str) -> None:
        request = placement.GroupRequest(group, {GPU: n}, {}, strategy, {GPU: share} if share else {})
        snap = self.book.snapshot()
        indexed, naive = placement.place_on(snap, request, ANY_POD), placement.place_linear(snap, request, ANY_POD)
        assert indexed == naive
        placement.schedule_group(self.book, request, ANY_POD)

    @rule(group=st.sampled_from(GROUPS))
    def commit(self, group: tuple[str, str]) -> None:
        if self.book.allocation(group) is not None:
            assert self.book.commit(group).state is ledger.AllocationState.COMMITTED

    @rule(group=st.sampled_from(GROUPS))
    def release(self, group: tuple[str, str]) -> None:
        self.book.release(group)

    @rule(name=st.sampled_from(NODES), gpus=st.integers(0, 4), memory=st.sampled_from([None, 16 * GI, 40 * GI]),
          tiles=st.integers(0, 2), ready=st.booleans())
    def change_node(self, name: str, gpus: int, memory: int | None, tiles: int, ready: bool) -> None:
        self.book.upsert_node(node(name, gpus, memory, tiles, ready=ready))
        # a node that shrinks under its holders breaks capacity without anyone reserving: reported
        self.contested |= {(c.node, c.resource, c.device) for c in self.book.contested()}

    @rule(claims=st.lists(
        st.tuples(st.sampled_from(GROUPS), st.sampled_from(NODES), device_sets, shares, st.integers(0, 1)),
        max_size=6,
    ))
    def rebuild(self, claims: list[tuple[tuple[str, str], str, set[str], capacity.Share | None, int]]) -> None:
        report = self.book.rebuild(
            ledger.Claim(g, n, {GPU: sorted(d)}, "status of x", {GPU: s} if s else {}, tiles_for(sorted(d), s, o) or {})
            for g, n, d, s, o in claims
        )
        self.contested = {(c.node, c.resource, c.device) for c in report.conflicts}
        assert set(self.book.contested()) == set(report.conflicts)

    @invariant()
    def consistent(self) -> None:
        now = {(c.node, c.resource, c.device) for c in self.book.contested()}
        assert now <= self.contested  # reserve, schedule, commit and release never make a conflict
        self.contested = now  # releases may clear one
        check_invariants(self.book, self.contested)


ShareLedgerMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestShareLedgerMachine = ShareLedgerMachine.TestCase


@settings(max_examples=8, deadline=None)
@given(
    threads=st.integers(2, 6),
    nodes=st.integers(1, 3),
    mix=st.lists(shares, min_size=1, max_size=4),
    strategy=st.sampled_from(["binpack", "spread"]),
)
def test_concurrent_reservations_never_exceed_a_device(
    threads: int, nodes: int, mix: list[capacity.Share | None], strategy: str
) -> None:
    book = ledger.DeviceLedger()
    for i in range(nodes):
        book.upsert_node(node(f"n{i}"))

    def worker(t: int, stepped: Callable[[], None]) -> None:
        mine: list[tuple[str, str]] = []
        for step in range(30):
            stepped()
            share = mix[step % len(mix)]
            group = (f"t{t}", f"g{step}")
            request = placement.GroupRequest(group, {GPU: 1}, {}, strategy, {GPU: share} if share else {})
            got = placement.schedule_group(book, request, ANY_POD, attempts=50)
            if isinstance(got, ledger.Allocation):
                mine.append(group)
            if mine and (step % 3 == 0 or not isinstance(got, ledger.Allocation)):
                book.release(mine.pop(0))

    interleaved(book, worker, threads)  # every step's decisions made on one snapshot, then reserved at once
    assert book.contested() == ()
    check_invariants(book, set())
