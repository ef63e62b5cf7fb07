"""``schedulingStrategy: fgd`` in the core: which node and device FGD picks, on hand-worked clusters.

Each case is small enough to work out by hand with the paper's measure: a node's fragment for a
shape is its idle GPU on cards too small for the shape, or all its idle GPU when the shape does
not fit there at all (not enough GPUs, or not enough CPU left).
"""

from __future__ import annotations

from collections.abc import Mapping

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings
from tests.core import builders

from deviceshare.core import capacity, fgdindex, fgdplacement, fgdratings, inventory, ledger, placement, workloadmix
from deviceshare.core import fragmentation as frag

GPU = builders.GPU
WHOLE_1 = frag.Shape(0, 1000, 1, GPU)
HALF = frag.Shape(0, 500, 1, GPU)


def _policy(shapes: Mapping[frag.Shape, int]) -> fgdplacement.FGDPlacement:
    return fgdplacement.FGDPlacement(
        workloadmix.ShapeHistogram.seeded(s for s, n in shapes.items() for _ in range(n))
    )


def _request(name: str, count: int = 1, share: capacity.Share | None = None, strategy: str = "fgd"
             ) -> placement.GroupRequest:
    return placement.GroupRequest(("ns", name), {GPU: count}, {}, strategy, {GPU: share} if share else {})


def _place(
    book: ledger.DeviceLedger, policy: fgdplacement.FGDPlacement, request: placement.GroupRequest, cpu: int = 0
) -> ledger.Allocation:
    pod = inventory.PodDemand(cpu_milli=cpu)
    got = placement.schedule_group(book, request, pod, policy=policy.for_pod(pod))
    assert isinstance(got, ledger.Allocation), got
    policy.observe(request, cpu)
    return got


def test_a_half_share_goes_onto_the_half_used_gpu_when_whole_gpus_are_expected() -> None:
    # "a": 2 fresh GPUs; "b": GPU 0 half used, GPU 1 fresh. A 0.5 share on a fresh GPU would
    # leave a 500m hole no whole-GPU group can use; on b's GPU 0 it closes one.
    book = ledger.DeviceLedger()
    book.upsert_node(builders.node("a", gpus=2))
    book.upsert_node(builders.node("b", gpus=2))
    book.reserve(("ns", "old"), "b", {GPU: ["0"]}, {GPU: capacity.Share(500)})
    policy = _policy({WHOLE_1: 3, HALF: 1})
    got = _place(book, policy, _request("new", share=capacity.Share(500)))
    assert (got.node, got.devices[GPU]) == ("b", ("0",))


def test_a_gpu_group_avoids_the_node_whose_cpu_it_would_exhaust() -> None:
    # The workload's pods need 4 cores per GPU. On "a" (2 GPUs, 4 cores free) a 1-GPU pod takes
    # every core and strands the other GPU; "b" (3 GPUs, 64 cores) keeps both its others usable.
    # binpack (fewest free devices left) takes "a"; fgd takes "b".
    book = ledger.DeviceLedger()
    book.upsert_node(builders.node("a", gpus=2, cpu_milli=4000))
    book.upsert_node(builders.node("b", gpus=3, cpu_milli=64000))
    policy = _policy({frag.Shape(4000, 1000, 1, GPU): 1})
    pod = inventory.PodDemand(cpu_milli=4000)
    binpack = placement.place_on(book.snapshot(), _request("x", strategy="binpack"), pod)
    assert isinstance(binpack, placement.Placement) and binpack.node == "a"
    assert _place(book, policy, _request("x"), cpu=4000).node == "b"


def test_whole_gpu_groups_take_fully_free_gpus_as_binpack_does() -> None:
    book = ledger.DeviceLedger()
    book.upsert_node(builders.node("a", gpus=4))
    book.reserve(("ns", "s"), "a", {GPU: ["1"]}, {GPU: capacity.Share(300)})
    binpack = placement.place_on(book.snapshot(), _request("w", count=2, strategy="binpack"), inventory.PodDemand())
    got = _place(book, _policy({WHOLE_1: 1}), _request("w", count=2))
    assert isinstance(binpack, placement.Placement)
    assert got.devices[GPU] == binpack.devices[GPU] and "1" not in got.devices[GPU] and not got.share


def test_equal_scores_go_to_the_node_name_that_sorts_first_every_time() -> None:
    book = ledger.DeviceLedger()
    for name in ("n3", "n1", "n2"):
        book.upsert_node(builders.node(name, gpus=8))
    policy = _policy({WHOLE_1: 1, HALF: 1})
    # consistent tie-breaking packs: the same node keeps winning until it stops being the best
    nodes = [_place(book, policy, _request(f"g{i}")).node for i in range(4)]
    assert nodes == ["n1"] * 4


def test_each_distinct_node_state_is_rated_once_per_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    book = ledger.DeviceLedger()
    for i in range(50):
        book.upsert_node(builders.node(f"n{i:02}", gpus=8))
    book.reserve(("ns", "busy"), "n07", {GPU: ["0"]})
    calls: list[frag.Signature] = []
    real = fgdratings.rate

    def counting(measure: frag.Fragmentation, sig: frag.Signature, shape: frag.Shape) -> object:
        calls.append(sig)
        return real(measure, sig, shape)

    monkeypatch.setattr(fgdratings, "rate", counting)
    _place(book, _policy({WHOLE_1: 1}), _request("g"))
    assert len(calls) == 2  # 49 fresh nodes share one state; n07 is the other


def test_a_memory_only_share_is_placed_in_binpack_order() -> None:
    book = ledger.DeviceLedger()
    for name in ("a", "b"):
        book.upsert_node(builders.node(name, gpus=2, device_memory={GPU: 16 << 30}))
    book.reserve(("ns", "old"), "b", {GPU: ["1"]}, {GPU: capacity.Share(0, 8 << 30)})
    got = _place(book, _policy({WHOLE_1: 1}), _request("m", share=capacity.Share(0, 4 << 30)))
    assert (got.node, got.devices[GPU]) == ("b", ("1",))


def test_a_group_that_fits_nowhere_is_unschedulable_with_reasons() -> None:
    book = ledger.DeviceLedger()
    book.upsert_node(builders.node("a", gpus=2))
    policy = _policy({WHOLE_1: 1})
    got = placement.schedule_group(book, _request("big", count=3), inventory.PodDemand(), policy=policy.for_pod(
        inventory.PodDemand()))
    assert isinstance(got, placement.Unschedulable)
    assert got.message() == "0/1 nodes are available: 1 insufficient nvidia.com/gpu."


def test_the_start_up_seed_counts_each_group_with_its_first_member_cpu() -> None:
    from deviceshare.api import models

    whole = models.GroupSpec.model_validate({"resources": {GPU: 2}})
    shared = models.GroupSpec.model_validate({"resources": {GPU: 1}, "share": {GPU: {"compute": "250m"}}})
    memory = models.GroupSpec.model_validate({"resources": {GPU: 1}, "share": {GPU: {"memory": "1Gi"}}})
    hist = fgdplacement.seed_histogram([
        (whole, [inventory.PodDemand(cpu_milli=3000)]), (shared, []), (shared, []), (memory, []),
    ])
    assert hist.weights() == {frag.Shape(3000, 1000, 2, GPU): 1.0, frag.Shape(0, 250, 1, GPU): 2.0}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 4), st.sampled_from([100, 250, 500, 700, 1000]), st.integers(0, 3)),
             min_size=1, max_size=25),
)
def test_every_fgd_choice_is_feasible_and_never_overcommits(groups: list[tuple[int, int, int]]) -> None:
    """Random arrivals through fgd: the indexed walk decides as the naive scan of every feasible node,
    each placement reserves cleanly, and compute on a device never passes 1."""
    book = ledger.DeviceLedger()
    for i in range(4):
        book.upsert_node(builders.node(f"n{i}", gpus=4, cpu_milli=16000))
    book.upsert_node(builders.node("m-small", gpus=2, cpu_milli=4000))  # sorts first: ties favour it
    book.upsert_node(builders.node("c-cordoned", gpus=8, unschedulable=True))
    policy = _policy({WHOLE_1: 2, HALF: 1})
    for i, (count, milli, cores) in enumerate(groups):
        share = capacity.Share(milli) if milli < 1000 else None
        request = _request(f"g{i}", count=count, share=share)
        pod = inventory.PodDemand(cpu_milli=cores * 1000)
        snap = book.snapshot()
        naive = placement.place_by_policy(snap, request, pod, policy.naive_for_pod(pod))
        assert placement.place_by_policy(snap, request, pod, policy.for_pod(pod)) == naive
        got = placement.schedule_group(book, request, pod, policy=policy.for_pod(pod))
        if isinstance(got, placement.Unschedulable):
            # fgd leaves a group Pending only when no node fits it at all
            assert isinstance(placement.place_linear(book.snapshot(), request, pod), placement.Unschedulable)
            continue
        book.account_pod(("ns", f"p{i}"), got.node, pod.cpu_milli, 0)
        policy.observe(request, pod.cpu_milli)
    assert book.contested() == ()
    for node in book.nodes():
        cpu, _ = book.used(node.name)
        assert cpu <= node.cpu_milli
        for device in node.devices[GPU]:
            use = book.use(node.name, GPU, device)
            assert use is None or use.compute_milli <= 1000


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "remove", "cordon", "take", "give"]), st.integers(0, 5)),
                max_size=30))
def test_the_class_index_follows_the_ledger_as_a_fresh_one_would(ops: list[tuple[str, int]]) -> None:
    """Nodes added, removed, cordoned, devices taken and given back between snapshots: the classes kept
    up to date by diffing shards equal classes built from scratch on the last snapshot."""
    book = ledger.DeviceLedger()
    policy = fgdplacement.FGDPlacement()

    def signature(state: ledger.NodeState) -> frag.Signature:
        return policy.signature(state, GPU)

    kept = fgdindex.SignatureClasses(GPU, signature)
    held: list[tuple[str, str]] = []
    for step, (op, i) in enumerate(ops):
        name = f"n{i}"
        if op == "add":
            book.upsert_node(builders.node(name, gpus=2 + i % 3))
        elif op == "remove":
            book.remove_node(name)
        elif op == "cordon" and book.node(name) is not None:
            book.upsert_node(builders.node(name, gpus=2 + i % 3, unschedulable=True))
        elif op == "take" and book.free_devices(name, GPU):
            book.reserve(("ns", f"g{step}"), name, {GPU: [book.free_devices(name, GPU)[0]]})
            held.append(("ns", f"g{step}"))
        elif op == "give" and held:
            book.release(held.pop(0))
        if step % 3 == 0:
            kept.update(book.snapshot())
    snap = book.snapshot()
    kept.update(snap)
    fresh = fgdindex.SignatureClasses(GPU, signature)
    fresh.update(snap)

    def named(index: fgdindex.SignatureClasses) -> dict[frag.Signature, list[str]]:
        return {index.signatures[cid]: names for cid, names in index.classes.items()}

    assert named(kept) == named(fresh)
    open_nodes = sorted(n for n in snap.nodes if fgdindex.is_open(snap.nodes[n]))
    assert sorted(n for names in named(kept).values() for n in names) == open_nodes
