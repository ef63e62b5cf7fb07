"""Pod usage accounted in one batch (as a rebuild does) leaves the ledger as the same pods accounted one at a time."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.core import builders

from deviceshare.core import ledger

NODES = ("n0", "n1", "n2")

# (pod, node, cpu milli, memory bytes): few pod names, so that a batch resizes and moves pods, and repeats them.
usages = st.lists(
    st.tuples(
        st.tuples(st.just("ns"), st.sampled_from(["p0", "p1", "p2", "p3"])),
        st.sampled_from((*NODES, "gone")),  # "gone": a node the ledger does not know
        st.integers(0, 4000),
        st.integers(0, 1 << 32),
    ),
    max_size=12,
)


def _book() -> ledger.DeviceLedger:
    book = ledger.DeviceLedger()
    for name in NODES:
        book.upsert_node(builders.node(name))
    return book


def _seen(book: ledger.DeviceLedger) -> tuple[object, ...]:
    snap = book.snapshot()
    return (
        {n: book.used(n) for n in (*NODES, "gone")},
        {n: (s.cpu_used, s.memory_used, dict(s.free)) for n, s in snap.nodes.items()},
        {r: dict(b) for r, b in snap.index.items()},
    )


@settings(max_examples=150, deadline=None)
@given(before=usages, batch=usages)
def test_a_batch_accounts_as_one_pod_at_a_time(
    before: list[tuple[tuple[str, str], str, int, int]], batch: list[tuple[tuple[str, str], str, int, int]]
) -> None:
    one, many = _book(), _book()
    for book in (one, many):  # both start from the same accounted pods
        for usage in before:
            book.account_pod(*usage)
    revision = many.revision
    for usage in batch:
        one.account_pod(*usage)
    many.account_pods(batch)
    assert _seen(many) == _seen(one)
    changed = _seen(one) != _seen(_replayed(before))
    assert many.revision > revision or not changed  # a change is always seen by snapshots taken before it


def _replayed(usages: list[tuple[tuple[str, str], str, int, int]]) -> ledger.DeviceLedger:
    book = _book()
    for usage in usages:
        book.account_pod(*usage)
    return book
