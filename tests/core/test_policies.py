"""Which node and GPU each policy picks, and the indexed engine against the naive one."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deviceshare.core import experiment, fgd, nodeclasses, policies
from deviceshare.core import fragmentation as frag
from deviceshare.core.fragmentation import Shape, WeightedShape
from deviceshare.core.nodeclasses import Cluster, Node, Pod

SHARE_500 = Shape(1000, 500, 1)
WHOLE_1 = Shape(1000, 1000, 1)


def paper(workload: tuple[WeightedShape, ...]) -> policies.FGDPolicy:
    return policies.FGDPolicy(fgd.Measure(fgd.VARIANTS["fgd"], workload))


def fgd_policy(*workload: WeightedShape) -> policies.FGDPolicy:
    return paper(workload)


def cluster(policy: policies.Policy, gpus: list[list[int]], order: list[int] | None = None, **kw: int) -> Cluster:
    nodes = [Node(f"n{i}", kw.get("cpu", 32_000), kw.get("mem", 65_536), len(g), "A") for i, g in enumerate(gpus)]
    got = Cluster(nodes, policy, order if order is not None else list(range(len(nodes))))
    for i, g in enumerate(gpus):  # preload the GPU state through the public path
        for index, free in enumerate(g):
            if free < frag.MILLI:
                got.bind(Pod(Shape(0, frag.MILLI - free, 1), 0), nodeclasses.Decision(i, (index,)))
    return got


def test_fgd_puts_a_share_where_it_completes_a_gpu_rather_than_breaking_a_whole_one() -> None:
    policy = fgd_policy(WeightedShape(SHARE_500, 0.5), WeightedShape(WHOLE_1, 0.5))
    c = cluster(policy, [[1000, 1000], [1000, 500]])
    assert c.decide(Pod(SHARE_500, 1024)) == nodeclasses.Decision(1, (1,))


def test_fgd_picks_the_first_gpu_index_with_the_best_score() -> None:
    policy = fgd_policy(WeightedShape(Shape(1000, 300, 1), 1.0))
    c = cluster(policy, [[1000, 600, 600, 1000]])
    # 600 -> 300 still fits another 300-share; 1000 -> 700 too: equal scores, first index wins
    assert c.decide(Pod(Shape(1000, 300, 1), 0)) == nodeclasses.Decision(0, (0,))


def test_bestfit_and_packing_take_the_tightest_gpu() -> None:
    for policy in (policies.BestFitPolicy(), policies.PackingPolicy()):
        c = cluster(policy, [[1000, 1000, 1000], [1000, 700, 600]])
        assert c.decide(Pod(SHARE_500, 0)) == nodeclasses.Decision(1, (2,)), policy.name


def test_packing_prefers_shared_gpus_then_used_nodes_then_small_empty_nodes() -> None:
    c = cluster(policies.PackingPolicy(), [[1000] * 8, [1000, 1000], [1000, 0]])
    assert c.decide(Pod(WHOLE_1, 0)).node == 2  # type: ignore[union-attr]  # a used node before empty ones
    c = cluster(policies.PackingPolicy(), [[1000] * 8, [1000, 1000]])
    assert c.decide(Pod(WHOLE_1, 0)).node == 1  # type: ignore[union-attr]  # the empty node with fewer GPUs


def test_ties_go_to_the_first_node_in_the_order_and_memory_filters() -> None:
    policy = policies.BestFitPolicy()
    assert cluster(policy, [[1000]] * 3, order=[2, 0, 1]).decide(Pod(WHOLE_1, 0)).node == 2  # type: ignore[union-attr]
    c = cluster(policy, [[1000]] * 3, order=[2, 0, 1], mem=1000)
    c.bind(Pod(Shape(0, 0, 0), 900), nodeclasses.Decision(2, ()))
    assert c.decide(Pod(WHOLE_1, 500)).node == 0  # type: ignore[union-attr]
    assert c.decide(Pod(WHOLE_1, 5000)) is None


def test_gpu_model_and_cpu_are_hard_filters() -> None:
    nodes = [Node("t4", 4000, 1024, 2, "T4"), Node("v100", 64_000, 1024, 2, "V100")]
    c = Cluster(nodes, policies.BestFitPolicy(), [0, 1])
    assert c.decide(Pod(Shape(1000, 1000, 1, "V100|A100"), 0)).node == 1  # type: ignore[union-attr]
    assert c.decide(Pod(Shape(8000, 0, 0), 0)).node == 1  # type: ignore[union-attr]
    assert c.decide(Pod(Shape(1000, 1000, 3), 0)) is None


def random_nodes(rng: random.Random, count: int) -> list[Node]:
    return [
        Node(f"n{i}", rng.choice([8000, 16_000, 32_000]), rng.choice([16_384, 65_536]), rng.choice([1, 2, 4, 8]),
             rng.choice(["A", "B"]))
        for i in range(count)
    ]  # fmt: skip


def random_pod(rng: random.Random) -> Pod:
    kind = rng.random()
    if kind < 0.15:
        shape = Shape(rng.choice([1000, 4000]), 0, 0)
    elif kind < 0.6:
        shape = Shape(rng.choice([1000, 2000]), rng.choice([100, 250, 500, 810]), 1, rng.choice(["", "", "A"]))
    else:
        shape = Shape(rng.choice([1000, 4000]), 1000, rng.choice([1, 1, 2, 4]), rng.choice(["", "B", "A|B"]))
    return Pod(shape, rng.choice([512, 4096, 12_000]))


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    which=st.sampled_from(["fgd", "bestfit", "packing", "fgd-fill", "fgd-fill-share", "fgd-scarce"]),
    tidy=st.booleans(),
)
def test_the_indexed_engine_decides_exactly_as_the_naive_one(seed: int, which: str, tidy: bool) -> None:
    rng = random.Random(seed)
    nodes = random_nodes(rng, 14)
    pods = [random_pod(rng) for _ in range(80)]
    policy: policies.Policy = {
        "fgd": lambda: paper(frag.target_workload(p.shape for p in pods)),
        "bestfit": policies.BestFitPolicy,
        "packing": policies.PackingPolicy,
        "fgd-fill": lambda: experiment.POLICIES["fgd-fill"](nodes, pods),
        "fgd-fill-share": lambda: experiment.POLICIES["fgd-fill-share"](nodes, pods),
        "fgd-scarce": lambda: experiment.POLICIES["fgd-scarce"](nodes, pods),
    }[which]()
    order = list(range(len(nodes)))
    rng.shuffle(order)
    c = Cluster(nodes, policy, order, tidy=tidy)
    if rng.random() < 0.5:  # pre-rated shapes (the target workload's) must decide the same
        c.prepare({p.shape for p in pods[:10]})
    for pod in pods:
        got = c.decide(pod)
        assert got == nodeclasses.decide_naive(c, pod)
        if got is not None:
            c.bind(pod, got)
    assert all(0 <= g <= frag.MILLI for gpus in c.gpu for g in gpus)
    assert all(cpu >= 0 for cpu in c.cpu) and all(m >= 0 for m in c.mem)


def test_random_policy_is_uniform_over_feasible_nodes_and_never_overcommits() -> None:
    nodes = [Node(f"n{i}", 4000, 1024, 1, "A") for i in range(4)]
    c = Cluster(nodes, policies.RandomPolicy(), [0, 1, 2, 3], seed=7)
    c.bind(Pod(WHOLE_1, 0), nodeclasses.Decision(0, (0,)))
    picks = [c.decide(Pod(Shape(1000, 500, 1), 0)) for _ in range(300)]
    counts = [sum(1 for p in picks if p is not None and p.node == n) for n in range(4)]
    assert counts[0] == 0 and min(counts[1:]) > 60
    c.bind(Pod(Shape(0, 600, 1), 0), nodeclasses.Decision(1, (0,)))
    with pytest.raises(ValueError, match="over-committed"):
        c.bind(Pod(Shape(0, 600, 1), 0), nodeclasses.Decision(1, (0,)))
    assert c.gpu[1] == [400] and c.decide(Pod(Shape(0, 400, 1), 0)) is not None


def test_tidying_bounds_how_far_any_shape_falls_behind() -> None:
    """The latency guarantee: a rare shape's next decision catches up on at most two changes per
    known shape, not on everything since its last pod (which, lazily, grows without bound)."""
    rng = random.Random(3)
    nodes = random_nodes(rng, 40)
    pods = [random_pod(rng) for _ in range(300)]
    workload = frag.target_workload(p.shape for p in pods)
    tidied = Cluster(nodes, paper(workload), list(range(40)))
    lazy = Cluster(nodes, paper(workload), list(range(40)), tidy=False)
    rare = Pod(Shape(1000, 130, 1), 0)
    for c in (tidied, lazy):
        c.prepare(w.shape for w in workload)
        c.decide(rare)  # seen once, then never again
        for pod in pods:
            got = c.decide(pod)
            if got is not None:
                c.bind(pod, got)
    behind = {c: len(c._log) - c._index[rare.shape].seen for c in (tidied, lazy)}
    assert behind[tidied] <= 2 * len(tidied._index)
    assert behind[lazy] > 4 * len(lazy._index)
    assert tidied.decide(rare) == lazy.decide(rare) == nodeclasses.decide_naive(tidied, rare)
