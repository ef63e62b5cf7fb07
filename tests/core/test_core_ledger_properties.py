"""Properties of the ledger that must hold after any sequence of operations, and under threads.

- a device on a node is held by at most one group, except devices a rebuild found already
  claimed by several groups (then only by those claimants, until they release);
- for every node and resource: free + held == capacity, and free and held never overlap;
- the free-capacity index files every open node under its current free count, and only those.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from tests import waiting
from tests.core import builders

from deviceshare.core import inventory, ledger, placement

GPU = builders.GPU
AMD = "amd.com/gpu"
NODES = ("n0", "n1", "n2")
GROUPS = tuple(("ns", f"g{i}") for i in range(6))

device_sets = st.fixed_dictionaries({GPU: st.sets(st.sampled_from("01234567"), min_size=1, max_size=4)})


def check_invariants(
    book: ledger.DeviceLedger, contested_ok: dict[tuple[str, str, str], set[tuple[str, str]]]
) -> None:
    allocations = book.allocations()
    held: dict[tuple[str, str, str], list[tuple[str, str]]] = collections.defaultdict(list)
    for alloc in allocations:
        for resource, ids in alloc.devices.items():
            for device in ids:
                held[(alloc.node, resource, device)].append(alloc.group)
    for key, groups in held.items():
        assert sorted(groups) == sorted(book.holders(*key))
        if len(groups) > 1:
            # only a rebuild can make a shared device, and only among the groups that claimed it
            assert set(groups) <= contested_ok.get(key, set()), (key, groups)
    snap = book.snapshot()
    indexed: dict[tuple[str, str], int] = {}
    for resource, buckets in snap.index.items():
        for count, names in buckets.items():
            assert list(names) == sorted(names)
            for name in names:
                assert (name, resource) not in indexed
                indexed[(name, resource)] = count
    for info in book.nodes():
        for resource, ids in info.devices.items():
            free = book.free_devices(info.name, resource)
            taken = [d for d in ids if (info.name, resource, d) in held]
            assert not set(free) & set(taken)
            assert len(free) + len(taken) == book.capacity(info.name, resource) == len(ids)
            assert list(free) == [d for d in ids if d not in taken]  # inventory order
            is_open = info.shared and info.ready and not info.unschedulable and not info.problems
            assert indexed.pop((info.name, resource), 0) == (len(free) if is_open else 0)
    assert indexed == {}  # no node filed that is gone or closed


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.book = ledger.DeviceLedger()
        self.contested: dict[tuple[str, str, str], set[tuple[str, str]]] = {}
        for name in NODES:
            self.book.upsert_node(builders.node(name, gpus=8))

    @rule(group=st.sampled_from(GROUPS), node=st.sampled_from(NODES), devices=device_sets)
    def reserve(self, group: tuple[str, str], node: str, devices: dict[str, set[str]]) -> None:
        before = self.book.allocation(group)
        wanted = {r: sorted(ids) for r, ids in devices.items()}
        try:
            got = self.book.reserve(group, node, wanted)
        except ledger.DeviceConflict:
            assert self.book.allocation(group) == before
            return
        assert got.node == node and {r: list(v) for r, v in got.devices.items()} == wanted

    @rule(group=st.sampled_from(GROUPS), strategy=st.sampled_from(["binpack", "spread"]), n=st.integers(1, 5))
    def schedule(self, group: tuple[str, str], strategy: str, n: int) -> None:
        request = placement.GroupRequest(group, {GPU: n}, {}, strategy)
        placement.schedule_group(self.book, request, inventory.PodDemand())

    @rule(group=st.sampled_from(GROUPS))
    def commit(self, group: tuple[str, str]) -> None:
        if self.book.allocation(group) is None:
            return
        assert self.book.commit(group).state is ledger.AllocationState.COMMITTED

    @rule(group=st.sampled_from(GROUPS))
    def release(self, group: tuple[str, str]) -> None:
        self.book.release(group)
        for groups in self.contested.values():
            groups.discard(group)

    @rule(node=st.sampled_from(NODES), gpus=st.integers(0, 8), ready=st.booleans(), shared=st.booleans())
    def change_node(self, node: str, gpus: int, ready: bool, shared: bool) -> None:
        self.book.upsert_node(builders.node(node, gpus=gpus, ready=ready, shared=shared))

    @rule(node=st.sampled_from(NODES))
    def remove_node(self, node: str) -> None:
        self.book.remove_node(node)

    @rule(
        claims=st.lists(
            st.tuples(st.sampled_from(GROUPS), st.sampled_from(NODES), device_sets, st.booleans()), max_size=6
        )
    )
    def rebuild(self, claims: list[tuple[tuple[str, str], str, dict[str, set[str]], bool]]) -> None:
        report = self.book.rebuild(
            ledger.Claim(g, n, {r: sorted(v) for r, v in d.items()}, "status of x" if s else "pod x")
            for g, n, d, s in claims
        )
        self.contested = {(c.node, c.resource, c.device): set(c.groups) for c in report.conflicts}
        assert set(self.book.contested()) == set(report.conflicts)

    @invariant()
    def consistent(self) -> None:
        check_invariants(self.book, self.contested)


LedgerMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestLedgerMachine = LedgerMachine.TestCase


@contextlib.contextmanager
def fast_thread_switching() -> Iterator[None]:
    """Switch threads every few microseconds so reservations really interleave."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def interleaved(book: ledger.DeviceLedger, worker: Callable[[int, Callable[[], None]], None], threads: int) -> int:
    """Run ``worker(t, step)`` for t in 0 .. threads - 1 in threads at once, in lockstep; the reservation
    conflicts seen (decisions made on a snapshot another thread's reservation overtook).

    Each worker calls ``step()`` before each operation. The first snapshot a thread takes in a step waits
    until every thread has taken its own: all decide on the same revision and then reserve at once, so the
    race between deciding and reserving happens in every step by construction, not when the operating
    system happens to switch threads at the right moment (on a busy machine it often does not, and the
    threads ran one after another).
    """
    aligned = threading.Barrier(threads, timeout=waiting.HANG_GUARD)
    local = threading.local()
    counts = collections.Counter[str]()  # conflicts, steps, waits
    counting = threading.Lock()  # += is no atomic step with threads switching every microsecond

    def count(what: str) -> None:
        with counting:
            counts[what] += 1

    take_snapshot, reserve = book.snapshot, book.reserve

    def snapshot() -> Any:
        taken = take_snapshot()
        if getattr(local, "waiting", False):
            local.waiting = False
            aligned.wait()
            count("waits")
        return taken

    def counted_reserve(*args: Any, **kwargs: Any) -> Any:
        try:
            return reserve(*args, **kwargs)
        except ledger.DeviceConflict:
            count("conflicts")
            raise

    def step() -> None:
        local.waiting = True
        count("steps")

    book.snapshot, book.reserve = snapshot, counted_reserve  # type: ignore[method-assign]
    errors: list[BaseException] = []

    def run(t: int) -> None:
        try:
            worker(t, step)
        except BaseException as exc:
            errors.append(exc)
            aligned.abort()  # the others stop waiting for it

    with fast_thread_switching():
        workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    book.snapshot, book.reserve = take_snapshot, reserve  # type: ignore[method-assign]
    assert errors == [], errors
    assert counts["waits"] == counts["steps"] > 0, "a step decided without the others: the race was not arranged"
    return counts["conflicts"]


@settings(max_examples=8, deadline=None)
@given(
    threads=st.integers(2, 6),
    nodes=st.integers(1, 4),
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    strategy=st.sampled_from(["binpack", "spread"]),
)
def test_concurrent_scheduling_never_gives_a_device_twice(
    threads: int, nodes: int, sizes: list[int], strategy: str
) -> None:
    book = ledger.DeviceLedger()
    for i in range(nodes):
        book.upsert_node(builders.node(f"n{i}", gpus=8))
    owners: dict[tuple[str, str, str], tuple[str, str]] = {}
    owners_lock = threading.Lock()

    def worker(t: int, stepped: Callable[[], None]) -> None:
        mine: list[ledger.Allocation] = []
        for step in range(40):
            stepped()
            group = (f"t{t}", f"g{step}")
            request = placement.GroupRequest(group, {GPU: sizes[step % len(sizes)]}, {}, strategy)
            got = placement.schedule_group(book, request, inventory.PodDemand(), attempts=50)
            if isinstance(got, ledger.Allocation):
                with owners_lock:
                    for device in got.devices[GPU]:
                        key = (got.node, GPU, device)
                        assert key not in owners, (
                            f"{key} given to {group} while {owners.get(key)} holds it"
                        )
                        owners[key] = group
                mine.append(got)
            if mine and (step % 3 == 0 or not isinstance(got, ledger.Allocation)):
                victim = mine.pop(0)
                with owners_lock:  # unclaim first: once released, another thread may get it at once
                    for device in victim.devices[GPU]:
                        del owners[(victim.node, GPU, device)]
                assert book.release(victim.group) == victim

    # In step 0 every thread decides the same on the same snapshot, and at least two of them fit: the
    # reservations race, and all but the first must decide again.
    assert interleaved(book, worker, threads) >= 1
    check_invariants(book, {})
    assert {(a.node, GPU, d) for a in book.allocations() for d in a.devices[GPU]} == set(owners)
