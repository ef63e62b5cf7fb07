"""The FGD screen's choice candidates (benchmarks/fgd_tuning.py): they decide what docs/benchmarks.md says they do."""

from __future__ import annotations

import random

from benchmarks import fgd_tuning

from deviceshare.core import fgd, nodeclasses
from deviceshare.core import fragmentation as frag

SHARES = (810, 470, 320, 650, 230, 160, 1000)


def _nodes(count: int) -> list[nodeclasses.Node]:
    return [nodeclasses.Node(f"n{i}", 32_000, 65_536, 2 + 2 * (i % 2), "G2") for i in range(count)]


def _pods(rng: random.Random, count: int) -> list[nodeclasses.Pod]:
    return [nodeclasses.Pod(frag.Shape(rng.choice((1000, 2000, 4000)), rng.choice(SHARES), 1), 1024)
            for _ in range(count)]  # fmt: skip


def _policy(nodes: list[nodeclasses.Node], pods: list[nodeclasses.Pod], candidate: str) -> fgd_tuning._Rechosen:
    policy = fgd_tuning.CANDIDATES[candidate](nodes, pods)
    assert isinstance(policy, fgd_tuning._Rechosen)
    return policy


def test_gap_counts_place_every_share_on_a_gap_the_rule_ranks_first_and_keep_the_counts_true() -> None:
    rng = random.Random(7)
    nodes, pods = _nodes(12), _pods(rng, 200)
    cluster = fgd_tuning._GapCountCluster(nodes, _policy(nodes, pods, "gap-counts"), list(range(len(nodes))))
    placed = 0
    for pod in pods:
        counts = dict(cluster.gaps)
        fitting = [g for gpus in cluster.gpu for g in gpus if g >= pod.shape.gpu_milli]
        decision = cluster.decide(pod)
        assert (decision is None) == (not fitting)  # memory and CPU are plentiful here: only the GPUs refuse
        if decision is None:
            continue
        taken = cluster.gpu[decision.node][decision.gpus[0]]
        if pod.shape.is_share:
            milli = pod.shape.gpu_milli

            def growth(gap: int, counts: dict[int, int] = counts, milli: int = milli) -> float:
                # the sum of squares of the gap counts once the share is on a GPU of this gap, less today's
                after = dict(counts)
                if gap < frag.MILLI:
                    after[gap] -= 1
                if gap > milli:
                    after[gap - milli] = after.get(gap - milli, 0) + 1
                return sum(n * n for n in after.values()) - sum(n * n for n in counts.values())

            assert growth(taken) == min(growth(g) for g in fitting)
        cluster.bind(pod, decision)
        placed += 1
        recount: dict[int, int] = {}
        for gpus in cluster.gpu:
            for g in gpus:
                if 0 < g < frag.MILLI:
                    recount[g] = recount.get(g, 0) + 1
        assert {g: n for g, n in cluster.gaps.items() if n} == recount
    assert 0 < placed < len(pods)  # the cluster filled up on the way


def test_tie_fit_sends_equal_scores_to_the_node_left_with_less_idle_gpu() -> None:
    nodes, pods = _nodes(2), _pods(random.Random(3), 50)
    plain, tie_fit = fgd.VARIANTS[fgd.BEST], _policy(nodes, pods, "tie-fit")
    emptier, fuller = ("G2", 32_000, (1000, 1000, 1000, 1000)), ("G2", 32_000, (1000, 1000, 0, 0))
    shape = frag.Shape(2000, 1000, 1)
    measure = fgd.Measure(plain, tie_fit.measure.workload, tie_fit.measure.types)
    scores = [measure.rate(s, shape) for s in (emptier, fuller)]
    refined = [tie_fit.evaluate(s, shape) for s in (emptier, fuller)]
    assert refined[0] is not None and refined[1] is not None
    assert scores[0] == scores[1]  # the premise: FGD's integer score ties the two
    assert refined[1].score > refined[0].score
    # the refinement never reorders what FGD's integer score tells apart
    assert (refined[0].score // fgd_tuning._TIE, refined[1].score // fgd_tuning._TIE) == tuple(
        s[0] for s in scores if s is not None
    )


def test_tight_gpu_keeps_only_the_tightest_of_the_best_gpus() -> None:
    nodes, pods = _nodes(2), _pods(random.Random(5), 50)
    tight, first = _policy(nodes, pods, "tight-gpu"), _policy(nodes, pods, "tie-fit")
    state, shape = ("G2", 32_000, (1000, 530, 530, 350)), frag.Shape(1000, 320, 1)
    wide, narrow = first.evaluate(state, shape), tight.evaluate(state, shape)
    assert wide is not None and narrow is not None
    assert narrow.gpu_values == (min(wide.gpu_values),)
