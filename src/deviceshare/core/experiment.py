"""The FGD paper's experiment as one call per (policy, seed): what ``deviceshare simulate`` and the
benchmark both run, so their figures agree.

Policies by name: ``random``, ``bestfit``, ``packing``, ``fgd`` (the paper's), and ours (see
:mod:`deviceshare.core.fgd`, the engine the operator decides with too). The fragmentation-aware ones
measure against the target workload of the pod list being replayed (the artifact's: the shapes
covering 95% of its pods) and the node types of the cluster.
Seeds are independent, so callers may run them in parallel processes: :func:`run_seed` takes and
returns only plain, picklable values.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from deviceshare.core import fgd, nodeclasses, policies, replay
from deviceshare.core import fragmentation as frag

FIRST_SEED = 42  # the artifact's seeds are 42, 43, ...
TUNING_SEEDS, TUNING_LISTS, HELD_OUT_SEEDS = fgd.TUNING_SEEDS, fgd.TUNING_LISTS, fgd.HELD_OUT_SEEDS


Build = Callable[[Sequence[nodeclasses.Node], Sequence[nodeclasses.Pod]], policies.Policy]


def _measured(name: str) -> Build:
    """An FGD engine policy over the list's target workload and the cluster's node types."""
    variant = fgd.VARIANTS[name]

    def build(nodes: Sequence[nodeclasses.Node], pods: Sequence[nodeclasses.Pod]) -> policies.Policy:
        workload = frag.target_workload(p.shape for p in pods)
        types = fgd.node_types((n.model, n.gpus, n.cpu_milli) for n in nodes)
        return policies.FGDPolicy(fgd.Measure(variant, workload, types), name=name)

    return build


POLICIES: Mapping[str, Build] = {
    "random": lambda nodes, pods: policies.RandomPolicy(),
    "bestfit": lambda nodes, pods: policies.BestFitPolicy(),
    "packing": lambda nodes, pods: policies.PackingPolicy(),
    **{name: _measured(name) for name in fgd.VARIANTS},
}


@dataclass(frozen=True, slots=True)
class SeedResult:
    policy: str
    seed: int
    curve: dict[int, float]  # arrived load % -> allocated GPU share %
    decisions: int
    placed: int
    seconds: float
    left: replay.Leftover  # idle GPU at the end of the run
    capacity_milli: int


def run_seed(
    nodes: Sequence[nodeclasses.Node], pods: Sequence[nodeclasses.Pod], policy: str, seed: int, ratio: float
) -> SeedResult:
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})")
    got = replay.replay(nodes, pods, POLICIES[policy](nodes, pods), seed, ratio)
    return SeedResult(
        policy, seed, got.curve(), len(got.arrived), got.placed, got.seconds, got.left, got.capacity_milli
    )


@dataclass(frozen=True, slots=True)
class Spread:
    median: float
    min: float
    max: float


def spread(results: Sequence[SeedResult], percent: int) -> Spread:
    values = [replay.allocated_at(r.curve, percent) for r in results]
    return Spread(statistics.median(values), min(values), max(values))


@dataclass(frozen=True, slots=True)
class Idle:
    """Median idle GPU at the end, in percent of capacity: whole GPUs, crumbs, the commonest crumb
    size over all seeds (free milli) with its median share, idle GPU stranded by CPU or memory, and
    idle GPU no pod of the list fits (see :class:`replay.Leftover`)."""

    whole: float
    crumbs: float
    stranded: float
    unfit: float
    commonest: int
    commonest_share: float


def idle(results: Sequence[SeedResult]) -> Idle:
    def pct(milli: int, r: SeedResult) -> float:
        return 100.0 * milli / r.capacity_milli if r.capacity_milli else 0.0

    per_seed = [dict(r.left.crumbs) for r in results]
    totals: dict[int, int] = {}
    for crumbs in per_seed:
        for free, count in crumbs.items():
            totals[free] = totals.get(free, 0) + free * count
    commonest = max(totals, key=lambda f: (totals[f], f), default=0)
    return Idle(
        whole=statistics.median(pct(r.left.whole_milli, r) for r in results),
        crumbs=statistics.median(pct(r.left.crumb_milli, r) for r in results),
        stranded=statistics.median(pct(r.left.stranded_milli, r) for r in results),
        unfit=statistics.median(pct(r.left.unfit_milli, r) for r in results),
        commonest=commonest,
        commonest_share=statistics.median(
            pct(commonest * c.get(commonest, 0), r) for r, c in zip(results, per_seed, strict=True)
        ),
    )


def decisions_per_second(results: Sequence[SeedResult]) -> float:
    seconds = sum(r.seconds for r in results)
    return sum(r.decisions for r in results) / seconds if seconds > 0 else 0.0


def report_points(ratio: float) -> tuple[int, ...]:
    """The loads reported: 100% (when reached) and the final load."""
    final = round(ratio * 100)
    return (100, final) if final > 100 else (final,)
