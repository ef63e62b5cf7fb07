"""``fgd``'s kept ratings: a moved mix rated in the background, CPU clamped in signatures.

What a user would notice if these went wrong: the indexed decision parting from the naive one
(every feasible node rated afresh) after a mix change or a shape never seen, a new mix never
taking over, or two nodes told apart (or not) by CPU that no shape can use.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings
from tests.core import builders

from deviceshare.core import capacity, fgdgroups, fgdplacement, fgdratings, inventory, ledger, placement, workloadmix
from deviceshare.core import fragmentation as frag

GPU = builders.GPU
WHOLE_1 = frag.Shape(1000, 1000, 1, GPU)
HALF = frag.Shape(1000, 500, 1, GPU)


def _request(name: str, count: int = 1, milli: int = 1000) -> placement.GroupRequest:
    share = {GPU: capacity.Share(milli)} if milli < 1000 else {}
    return placement.GroupRequest(("ns", name), {GPU: count}, {}, "fgd", share)


def _stale(policy: fgdplacement.FGDPlacement) -> list[tuple[frag.Shape, int]]:
    """(shape, class id) pairs whose kept rating differs from one computed now with its book's measure."""
    wrong = []
    for book in (policy.ratings.active, policy.ratings.pending):
        if book is None:
            continue
        for shape, ratings in book.ratings.items():
            index = policy._classes[shape.gpu_spec]
            for cid, got in ratings.items():
                if got != fgdratings.rate(book.measure, index.signatures[cid], shape):
                    wrong.append((shape, cid))
    return wrong


def _unclamped_choice(
    policy: fgdplacement.FGDPlacement, snap: ledger.LedgerSnapshot, request: placement.GroupRequest,
    pod: inventory.PodDemand,
) -> str | None:
    """FGD's node by the book: every feasible node rated on its true free CPU with the policy's measure."""
    shape = fgdplacement.shape_of(request.resources, request.share, pod.cpu_milli)
    assert shape is not None
    best, best_score = None, -1
    for name in sorted(snap.nodes):
        state = snap.nodes[name]
        if not placement._fits(state, request, pod):
            continue
        values = fgdgroups.free_values(state, GPU).values()
        got = fgdratings.rate(policy.measure(), frag.signature_of(GPU, state.info.cpu_milli - state.cpu_used,
                                                                     values), shape)
        if got is not None and got[0] > best_score:
            best, best_score = name, got[0]
    return best


_GROUPS = st.tuples(
    st.sampled_from([1, 1, 2, 4]),  # devices
    st.sampled_from([100, 250, 500, 750, 1000]),  # compute share per device (1000: whole devices)
    st.sampled_from([0, 1000, 2000, 6000, 20000]),  # CPU of the pod: 20 cores raises the clamp late
    st.booleans(),  # an older group leaves after this one
)


@settings(max_examples=40, deadline=None)
@given(st.lists(_GROUPS, min_size=1, max_size=60), st.integers(1, 30), st.integers(1, 6))
def test_decisions_stay_those_of_the_naive_scan_across_mix_changes(
    groups: list[tuple[int, int, int, bool]], budget: int, refresh: int
) -> None:
    """Arrivals of new shapes, departures, a mix re-rated every few placements over several decisions:
    every decision equals the naive one on the same snapshot (asked before and after it) and FGD's
    choice on the nodes' true free CPU, every kept rating equals a fresh one of its measure, and no
    device or node is ever overcommitted."""
    book = ledger.DeviceLedger()
    for i in range(10):  # free CPU differs far above any shape's (clamped alike) and near it (told apart)
        book.upsert_node(builders.node(f"n{i}", gpus=2 + i % 3, cpu_milli=(8 + 8 * (i % 4)) * 1000))
    policy = fgdplacement.FGDPlacement(
        workloadmix.ShapeHistogram.seeded([WHOLE_1, WHOLE_1, HALF], half_life=20), refresh=refresh
    )
    policy.ratings.budget = budget
    held: list[tuple[str, str]] = []
    for i, (count, milli, cpu, leave) in enumerate(groups):
        request, pod = _request(f"g{i}", 1 if milli < 1000 else count, milli), inventory.PodDemand(cpu_milli=cpu)
        snap = book.snapshot()
        naive_first = placement.place_by_policy(snap, request, pod, policy.naive_for_pod(pod))
        got = placement.place_by_policy(snap, request, pod, policy.for_pod(pod))
        assert got == naive_first == placement.place_by_policy(snap, request, pod, policy.naive_for_pod(pod))
        assert (got.node if isinstance(got, placement.Placement) else None) == _unclamped_choice(
            policy, snap, request, pod
        )
        assert _stale(policy) == []
        if isinstance(got, placement.Placement):
            book.reserve(request.key, got.node, got.devices, request.share)
            book.account_pod(request.key, got.node, cpu, 0)
            policy.observe(request, cpu)
            held.append(request.key)
        if leave and held:
            gone = held.pop(0)
            book.release(gone)
            book.forget_pod(gone)
    assert book.contested() == ()
    for node in book.nodes():
        assert book.used(node.name)[0] <= node.cpu_milli
        for device in node.devices[GPU]:
            use = book.use(node.name, GPU, device)
            assert use is None or use.compute_milli <= 1000


def _cluster(nodes: int) -> ledger.DeviceLedger:
    book = ledger.DeviceLedger()
    for i in range(nodes):
        book.upsert_node(builders.node(f"n{i:02}", gpus=4, cpu_milli=64000))
    return book


def _place(book: ledger.DeviceLedger, policy: fgdplacement.FGDPlacement, name: str, milli: int) -> None:
    request, pod = _request(name, 1, milli), inventory.PodDemand(cpu_milli=1000)
    got = placement.schedule_group(book, request, pod, policy=policy.for_pod(pod))
    assert isinstance(got, ledger.Allocation)
    policy.observe(request, 1000)


def test_a_moved_mix_takes_over_between_placements_once_every_shape_was_rated() -> None:
    book = _cluster(30)
    policy = fgdplacement.FGDPlacement(workloadmix.ShapeHistogram.seeded([WHOLE_1]), refresh=1)
    policy.ratings.budget = 1  # a few ratings a decision: the pass over the classes takes several
    _place(book, policy, "a", 250)  # the first decision takes the mix as it is: whole GPUs only
    first = policy.measure()
    assert [w.shape for w in first.workload] == [WHOLE_1]
    assert policy.ratings.pending is not None  # a quarter share joined the mix: rated in the background
    measures = []
    for i in range(30):
        _place(book, policy, f"g{i}", 250)
        measures.append(policy.measure())
        if policy.measure() is not first:
            break
    assert first in measures[:1] and measures[-1] is not first, "the new mix never took over"
    assert frag.Shape(1000, 250, 1, GPU) in {w.shape for w in policy.measure().workload}


def test_nodes_that_differ_only_in_cpu_no_shape_can_use_share_a_class_until_a_larger_shape_comes() -> None:
    book = ledger.DeviceLedger()
    book.upsert_node(builders.node("a", gpus=2, cpu_milli=64000))
    book.upsert_node(builders.node("b", gpus=2, cpu_milli=96000))
    policy = fgdplacement.FGDPlacement(workloadmix.ShapeHistogram.seeded([WHOLE_1, HALF]))
    snap = book.snapshot()
    a, b = snap.nodes["a"], snap.nodes["b"]
    assert policy.signature(a, GPU) == policy.signature(b, GPU)  # 64 or 96 cores: no 1-core shape can tell
    pod = inventory.PodDemand(cpu_milli=80000)  # this one fits b only
    got = placement.place_by_policy(snap, _request("big"), pod, policy.for_pod(pod))
    assert isinstance(got, placement.Placement) and got.node == "b"
    assert policy.signature(a, GPU) != policy.signature(b, GPU)


def test_background_work_stays_within_its_budget_and_a_bad_budget_is_named() -> None:
    book = _cluster(40)
    for i in range(0, 40, 3):
        book.reserve(("ns", f"old{i}"), f"n{i:02}", {GPU: ["0"]}, {GPU: capacity.Share(100 * (1 + i % 7))})
    policy = fgdplacement.FGDPlacement(workloadmix.ShapeHistogram.seeded([WHOLE_1, HALF]))
    policy.ratings.budget = 5
    _place(book, policy, "x", 500)
    spent = policy.ratings.tend(policy._classes)
    assert spent <= 5 + fgdratings._FITS  # the last rating may overrun the units left
    with pytest.raises(ValueError, match="budget must be at least 1, got 0"):
        fgdratings.Ratings(fgdratings.rate, budget=0)


def test_a_clamp_an_early_mix_raised_comes_down_once_the_mix_moved_and_decisions_stay_fgds() -> None:
    """A first mix of one CPU-heavy sliver (100m with 16 cores: 160 CPU per milli of GPU) makes free CPU
    matter up to the whole node; once whole-GPU groups of 1 core dominate, the clamp comes down (nodes
    share classes again) and every decision is still the one FGD takes on the nodes' true free CPU."""
    book = ledger.DeviceLedger()
    for i in range(12):
        book.upsert_node(builders.node(f"n{i:02}", gpus=4, cpu_milli=(40 + 8 * (i % 5)) * 1000))
    policy = fgdplacement.FGDPlacement(
        workloadmix.ShapeHistogram.seeded([frag.Shape(16_000, 100, 1, GPU)], half_life=5), refresh=3
    )
    caps = []
    for i in range(40):
        request, pod = _request(f"g{i}"), inventory.PodDemand(cpu_milli=1000)
        snap = book.snapshot()
        got = placement.place_by_policy(snap, request, pod, policy.for_pod(pod))
        assert got == placement.place_by_policy(snap, request, pod, policy.naive_for_pod(pod))
        assert (got.node if isinstance(got, placement.Placement) else None) == _unclamped_choice(
            policy, snap, request, pod
        )
        caps.append(policy._cpu_cap)
        assert isinstance(got, placement.Placement)  # 48 GPUs for 40 one-GPU groups
        book.reserve(request.key, got.node, got.devices, request.share)
        book.account_pod(request.key, got.node, 1000, 0)
        policy.observe(request, 1000)
    assert caps[0] >= 4 * caps[-1], f"the clamp never came down: {caps}"
