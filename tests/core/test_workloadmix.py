"""The operator's learned target workload: seeding, decay, normalisation."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given

from deviceshare.core import workloadmix
from deviceshare.core.fragmentation import Shape

WHOLE = Shape(0, 1000, 1, "nvidia.com/gpu")
HALF = Shape(0, 500, 1, "nvidia.com/gpu")
EIGHT = Shape(8000, 1000, 8, "nvidia.com/gpu")


def test_seeding_counts_each_existing_group_once_with_no_decay() -> None:
    hist = workloadmix.ShapeHistogram.seeded([WHOLE, WHOLE, HALF], half_life=1)
    assert hist.weights() == {WHOLE: 2.0, HALF: 1.0}
    assert {w.shape: w.weight for w in hist.workload()} == {WHOLE: pytest.approx(2 / 3, abs=1 / 256),
                                                           HALF: pytest.approx(1 / 3, abs=1 / 256)}


def test_a_shape_halves_after_half_life_placements_of_others() -> None:
    hist = workloadmix.ShapeHistogram.seeded([WHOLE], half_life=10)
    for _ in range(10):
        hist.observe(HALF)
    assert hist.weights()[WHOLE] == pytest.approx(0.5)


def test_a_shape_nobody_asks_for_any_more_drops_out() -> None:
    hist = workloadmix.ShapeHistogram.seeded([EIGHT], half_life=5)
    for _ in range(100):
        hist.observe(WHOLE)
    assert EIGHT not in hist.weights()
    assert [w.shape for w in hist.workload()] == [WHOLE]


def test_the_workload_keeps_the_heaviest_shapes_covering_95_percent() -> None:
    hist = workloadmix.ShapeHistogram.seeded([WHOLE] * 60 + [HALF] * 38 + [EIGHT] * 2)
    assert [w.shape for w in hist.workload()] == [WHOLE, HALF]  # 98% covered without the rare one


def test_an_empty_histogram_has_no_workload_and_bad_settings_are_named() -> None:
    assert workloadmix.ShapeHistogram().workload() == ()
    with pytest.raises(ValueError, match="half_life must be positive"):
        workloadmix.ShapeHistogram(half_life=0)
    with pytest.raises(ValueError, match="coverage"):
        workloadmix.ShapeHistogram(coverage=1.5)


@given(st.lists(st.sampled_from([WHOLE, HALF, EIGHT]), min_size=1, max_size=300), st.floats(1, 1000))
def test_workload_weights_are_normalised_and_ordered(observed: list[Shape], half_life: float) -> None:
    hist = workloadmix.ShapeHistogram(half_life)
    for shape in observed:
        hist.observe(shape)
    workload = hist.workload()
    weights_now = hist.weights()
    assert workload[0].shape == max(weights_now, key=lambda s: (weights_now[s], s.cpu_milli, s.gpu_milli, s.num_gpu))
    assert sum(w.weight for w in workload) == pytest.approx(1.0, abs=len(workload) / 256)
    weights = [w.weight for w in workload]
    assert weights == sorted(weights, reverse=True)
