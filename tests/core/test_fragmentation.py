"""The FGD fragmentation measure and score on small hand-worked cases (the paper's definitions)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deviceshare.core import fgd, policies
from deviceshare.core import fragmentation as frag
from deviceshare.core.fragmentation import Shape, WeightedShape

SHARE_300 = Shape(cpu_milli=1000, gpu_milli=300, num_gpu=1)
WHOLE_1 = Shape(cpu_milli=2000, gpu_milli=1000, num_gpu=1)
HALF_HALF = (WeightedShape(SHARE_300, 0.5), WeightedShape(WHOLE_1, 0.5))


def measure(*workload: WeightedShape) -> frag.Fragmentation:
    return frag.Fragmentation(workload)


def test_only_gpus_too_small_for_a_fitting_shape_are_fragments() -> None:
    node = frag.signature_of("A", 8000, [1000, 500, 200, 0])
    # share-300: the 200 is too small (200); whole-1: all partially used GPUs are (500 + 200)
    assert measure(*HALF_HALF)(node) == pytest.approx(0.5 * 200 + 0.5 * 700)


def test_a_shape_the_node_cannot_host_makes_all_idle_gpu_a_fragment() -> None:
    idle = 1000 + 500 + 200
    short_of_cpu = frag.signature_of("A", 1500, [1000, 500, 200, 0])  # whole-1 needs 2000
    assert measure(*HALF_HALF)(short_of_cpu) == pytest.approx(0.5 * 200 + 0.5 * idle)
    no_full_gpu = frag.signature_of("A", 8000, [900, 500, 200, 0])
    assert measure(WeightedShape(WHOLE_1, 1.0))(no_full_gpu) == pytest.approx(1600)
    two_gpus = Shape(1000, 1000, 2)
    assert measure(WeightedShape(two_gpus, 1.0))(frag.signature_of("A", 8000, [1000, 300])) == pytest.approx(1300)


def test_wrong_model_and_cpu_only_shapes_count_all_idle_gpu() -> None:
    node = frag.signature_of("T4", 8000, [1000, 400])
    v100_only = Shape(1000, 300, 1, "V100M16|V100M32")
    assert measure(WeightedShape(v100_only, 1.0))(node) == pytest.approx(1400)
    assert measure(WeightedShape(Shape(4000, 0, 0), 1.0))(node) == pytest.approx(1400)
    t4_or_v100 = Shape(1000, 300, 1, "T4|V100M16")
    assert measure(WeightedShape(t4_or_v100, 1.0))(node) == 0


def test_paper_figure_example_a_full_node_has_no_fragment_and_a_sliver_does() -> None:
    # A node whose GPUs are all used has nothing to waste; a 0.1-GPU sliver no pending shape fits is lost.
    workload = (WeightedShape(Shape(1000, 500, 1), 0.6), WeightedShape(Shape(1000, 1000, 1), 0.4))
    assert measure(*workload)(frag.signature_of("A", 8000, [0, 0])) == 0
    assert measure(*workload)(frag.signature_of("A", 8000, [100, 0])) == pytest.approx(100)
    # Placing a 0.5 share on a fresh GPU of [1000, 1000] leaves 500 that only the whole-GPU shape wastes.
    before = frag.signature_of("A", 8000, [1000, 1000])
    after = frag.after_share(before, Shape(1000, 500, 1), 1000)
    assert after == ("A", 7000, (1000, 500))
    assert measure(*workload)(after) == pytest.approx(0.4 * 500)


def test_sigmoid_score_is_an_integer_centred_on_50() -> None:
    assert frag.sigmoid_score(100.0, 100.0) == 50
    assert frag.sigmoid_score(0.0, 2000.0) == 11  # int(100 * sigmoid(-2))
    assert frag.sigmoid_score(2000.0, 0.0) == 88
    assert frag.sigmoid_score(0.0, 1e9) == 0


def test_target_workload_covers_95_percent_and_renormalises() -> None:
    a, b, c = Shape(1000, 0, 0), Shape(2000, 500, 1), Shape(4000, 1000, 1)
    shapes = [a] * 60 + [b] * 36 + [c] * 4
    got = frag.target_workload(shapes)
    assert [w.shape for w in got] == [a, b]  # 60 + 36 = 96 >= 95: c is left out
    assert [w.weight for w in got] == pytest.approx([60 / 96, 36 / 96])
    # equal counts: the larger shape first, as the artifact sorts
    assert [w.shape for w in frag.target_workload([a, c], coverage=0.5)] == [c]


def test_trace_shapes_follow_the_artifact() -> None:
    assert frag.normalized_shape(4000, 0, 0, "T4") == Shape(4000, 0, 0, "")
    assert frag.normalized_shape(4000, 1000, 2, "|T4|P100") == Shape(4000, 1000, 2, "T4|P100")


gpu_lists = st.lists(st.integers(0, 1000), min_size=0, max_size=8)
shapes = st.builds(
    frag.normalized_shape,
    st.integers(0, 16_000),
    st.sampled_from([0, 100, 250, 500, 810, 1000]),
    st.integers(0, 4),
    st.sampled_from(["", "A", "B|A"]),
)


@given(gpus=gpu_lists, cpu=st.integers(0, 64_000), workload=st.lists(shapes, min_size=1, max_size=6))
def test_fragmentation_is_between_zero_and_the_idle_gpu(gpus: list[int], cpu: int, workload: list[Shape]) -> None:
    node = frag.signature_of("A", cpu, gpus)
    got = measure(*frag.target_workload(workload, coverage=1.0))(node)
    assert -1e-6 <= got <= sum(gpus) + 1e-6


@given(gpus=gpu_lists, cpu=st.integers(0, 64_000), workload=st.lists(shapes, min_size=1, max_size=6))
def test_the_cpu_table_agrees_with_the_shape_by_shape_definition(
    gpus: list[int], cpu: int, workload: list[Shape]
) -> None:
    m = measure(*frag.target_workload(workload, coverage=1.0))
    for model in ("A", "B"):
        node = frag.signature_of(model, cpu, gpus)
        assert m(node) == pytest.approx(m.compute_direct(node))
        assert m.compute(node) == pytest.approx(m.compute_direct(node))


def test_fill_ahead_counts_the_gpu_a_shape_alone_would_leave_idle() -> None:
    twelve_cores = Shape(12_000, 1000, 1)
    node = frag.signature_of("A", 24_000, [1000] * 8)
    assert measure(WeightedShape(twelve_cores, 1.0))(node) == 0  # the paper's: the shape fits
    ahead = frag.Fragmentation((WeightedShape(twelve_cores, 1.0),), fill_ahead=1.0)
    assert ahead(node) == pytest.approx(6000)  # two hosted, six GPUs left for good
    blended = frag.Fragmentation((WeightedShape(twelve_cores, 1.0),), fill_ahead=0.25)
    assert blended(node) == pytest.approx(1500)


def test_fill_ahead_for_shares_only_leaves_whole_gpu_shapes_at_the_papers_fragment() -> None:
    half = Shape(1000, 500, 1)  # 2 cores free: two of them fit, 3 of the 4 idle GPUs stay idle
    whole = Shape(1000, 1000, 1)  # two fit as well, 2 GPUs stay idle
    workload = (WeightedShape(half, 0.5), WeightedShape(whole, 0.5))
    sig: frag.Signature = ("A", 2000, (1000, 1000, 1000, 1000))
    assert frag.Fragmentation(workload)(sig) == 0  # the paper: both shapes fit, no small GPU
    shares = frag.Fragmentation(workload, fill_ahead=0.5, shares_only=True)
    assert shares(sig) == pytest.approx(0.5 * 0.5 * 3000)
    both = frag.Fragmentation(workload, fill_ahead=0.5)
    assert both(sig) == pytest.approx(0.5 * 0.5 * 3000 + 0.5 * 0.5 * 2000)


def test_balance_counts_the_idle_gpu_the_free_cpu_cannot_feed() -> None:
    four_cores = Shape(4000, 1000, 1)  # the workload asks 4 cores per GPU
    workload = (WeightedShape(four_cores, 1.0),)
    starved: frag.Signature = ("A", 16_000, (1000,) * 8)  # 16 cores feed 4 of the 8 idle GPUs
    fed: frag.Signature = ("A", 40_000, (1000,) * 8)
    plain = frag.Fragmentation(workload)
    balanced = frag.Fragmentation(workload, balance=2.0)
    assert plain(starved) == plain(fed) == 0  # the paper's: the shape fits once, nothing is fragment
    assert balanced.unfed(starved) == pytest.approx(4000)
    assert balanced(starved) == pytest.approx(8000)  # weighted 2:1
    assert balanced.compute(starved) == pytest.approx(8000)  # the unmemoised path agrees
    assert balanced(fed) == 0


def test_balance_averages_cpu_per_gpu_over_gpu_shapes_by_weight_and_size() -> None:
    share = Shape(2000, 500, 1)  # 2 cores for half a GPU
    pair = Shape(8000, 1000, 2)  # 8 cores for two GPUs
    cpu_only = Shape(32_000, 0, 0)  # asks no GPU: not part of the ratio
    workload = (WeightedShape(share, 0.4), WeightedShape(pair, 0.4), WeightedShape(cpu_only, 0.2))
    # (0.4 x 2000 + 0.4 x 8000) CPU over (0.4 x 500 + 0.4 x 2000) GPU milli: 4 CPU milli per GPU milli
    balanced = frag.Fragmentation(workload, balance=1.0)
    assert balanced.unfed(("A", 6000, (1000, 1000, 500))) == pytest.approx(2500 - 1500)
    assert balanced.unfed(("A", 6000, (0, 0))) == 0  # nothing idle, nothing unfed


def test_with_balance_a_cpu_heavy_share_prefers_the_node_with_cpu_to_spare() -> None:
    heavy = Shape(12_000, 470, 1)  # the openb trace's CPU-heavy 0.47-GPU pods
    light = Shape(3000, 810, 1)
    workload = (WeightedShape(heavy, 0.5), WeightedShape(light, 0.5))
    poor: frag.Signature = ("A", 24_000, (1000,) * 8)  # 8 GPUs, 24 cores
    rich: frag.Signature = ("A", 96_000, (1000,) * 2)  # 2 GPUs, 96 cores
    paper = policies.FGDPolicy(fgd.Measure(fgd.VARIANTS["fgd"], workload))
    assert paper.evaluate(poor, heavy) == paper.evaluate(rich, heavy)  # the paper's measure cannot tell them apart
    policy = policies.FGDPolicy(fgd.Measure(fgd.Variant(balance=4.0), workload))
    on_poor, on_rich = policy.evaluate(poor, heavy), policy.evaluate(rich, heavy)
    assert on_poor is not None and on_rich is not None
    assert on_rich.score > on_poor.score
