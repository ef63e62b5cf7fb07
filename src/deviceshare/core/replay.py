"""Replay of a GPU-cluster trace through a placement policy, the way the FGD artifact runs it.

Why a separate engine: the paper's figures come from a simulator whose details decide them
(``../shared/NOTES.md``), and a capacity-planning command needs the same replay to be fast.

- **Load**: per seed, the node order (the tie-break: the artifact prefixes node names with a
  random string and lets the alphabetically smallest win) is a random permutation; the pod list
  is shuffled, then random copies of its pods are appended until the requested GPUs would pass
  ``ratio`` x the cluster's GPUs (or random pods are removed while they exceed it). Pods never
  leave; one that fits nowhere is dropped but counts as arrived.
- **Measure**: "allocated at X%" is the GPU milli in use over the cluster's GPU milli, averaged
  over the pods whose arrived GPU request (in percent of capacity) rounds to X.
- **Leftover**: what the cluster has idle at the end, split into whole idle GPUs and *crumbs* (the
  free share of partly used GPUs), with the commonest crumb sizes, the idle GPU stranded by its
  node's CPU or memory, and the crumbs too small for any pod of the list: where capacity is lost.
- **Speed**: decisions go through :class:`nodeclasses.Cluster` (nodes grouped by state, each
  state rated once per pod shape).
"""

from __future__ import annotations

import collections
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from deviceshare.core import fragmentation as frag
from deviceshare.core import policies
from deviceshare.core.nodeclasses import Cluster, Node, Pod


def arrivals(pods: Sequence[Pod], capacity_milli: int, rng: random.Random, ratio: float) -> list[int]:
    """Pod indices in arrival order: the list shuffled, then grown (or pruned) to ``ratio`` x capacity."""
    order = list(range(len(pods)))
    rng.shuffle(order)
    target = ratio * capacity_milli
    total = sum(pods[i].shape.total_gpu_milli for i in order)
    while total > target and order:
        total -= pods[order.pop(rng.randrange(len(order)))].shape.total_gpu_milli
    while pods and total < target:
        i = rng.randrange(len(pods))
        # the artifact compares with the pod's per-GPU share here, not its total; kept for fidelity
        if total + pods[i].shape.gpu_milli > target:
            break
        total += pods[i].shape.total_gpu_milli
        order.append(i)
    return order


@dataclass(frozen=True, slots=True)
class Leftover:
    """Idle GPU milli at the end of a replay: on fully free GPUs, and on partly used ones (crumbs).

    ``stranded_milli`` (whole or crumb) is idle GPU that a one-GPU pod of the list would fit by
    GPU share and model but not by its node's free CPU or memory; ``unfit_milli`` idle GPU that no
    pod of the list fits at all (too small a crumb, or a model no pod may use).
    """

    whole_milli: int = 0
    crumb_milli: int = 0
    crumbs: tuple[tuple[int, int], ...] = ()  # (free milli, GPUs with that much free), commonest by milli first
    stranded_milli: int = 0
    unfit_milli: int = 0


def leftover(cluster: Cluster, pods: Sequence[Pod]) -> Leftover:
    """What ``cluster`` has idle, judged against the pods of the list (one-GPU pods, by GPU share,
    model, CPU and memory)."""
    needs = sorted({(p.shape.gpu_milli, p.shape.cpu_milli, p.memory_mib, p.shape.gpu_spec)
                    for p in pods if p.shape.num_gpu == 1})  # fmt: skip
    models = {n.model for n in cluster.nodes}
    by_model = {m: [(g, c, mem) for g, c, mem, spec in needs if not spec or m in spec.split("|")] for m in models}
    smallest = {m: rows[0][0] if rows else frag.MILLI + 1 for m, rows in by_model.items()}
    whole = stranded = unfit = 0
    sizes: collections.Counter[int] = collections.Counter()
    for node, gpus in enumerate(cluster.gpu):
        model, cpu, mem = cluster.nodes[node].model, cluster.cpu[node], cluster.mem[node]
        for free in gpus:
            if free <= 0:
                continue
            if free >= frag.MILLI:
                whole += free
            else:
                sizes[free] += 1
            if free < smallest[model]:
                unfit += free
            elif not any(g <= free and c <= cpu and m <= mem for g, c, m in by_model[model]):
                stranded += free
    ranked = sorted(sizes.items(), key=lambda kv: (-kv[0] * kv[1], -kv[0]))
    return Leftover(whole, sum(free * count for free, count in ranked), tuple(ranked), stranded, unfit)


@dataclass(slots=True)
class Replay:
    capacity_milli: int
    arrived: list[int] = field(default_factory=list)  # cumulative GPU milli requested, per pod
    allocated: list[int] = field(default_factory=list)  # GPU milli in use after each pod
    placed: int = 0
    seconds: float = 0.0  # time spent deciding
    left: Leftover = field(default_factory=Leftover)  # idle GPU once every pod has arrived

    def curve(self) -> dict[int, float]:
        """Arrived load (percent of GPU capacity, rounded) -> GPU share in use (percent), averaged
        over the pods whose arrival rounds to that load: the artifact's "allocated at X%"."""
        sums: dict[int, list[int]] = {}
        for arrived, allocated in zip(self.arrived, self.allocated, strict=True):
            entry = sums.setdefault(math.floor(100 * arrived / self.capacity_milli + 0.5), [0, 0])
            entry[0] += allocated
            entry[1] += 1
        return {p: 100.0 * total / count / self.capacity_milli for p, (total, count) in sums.items()}

    def allocated_at(self, percent: int) -> float:
        return allocated_at(self.curve(), percent)

    @property
    def decisions_per_second(self) -> float:
        return len(self.arrived) / self.seconds if self.seconds > 0 else 0.0


def allocated_at(curve: dict[int, float], percent: int) -> float:
    """The share at ``percent`` load; if the load never rounded to it, the last share before it."""
    if percent in curve:
        return curve[percent]
    below = [p for p in curve if p < percent]
    return curve[max(below)] if below else 0.0


def replay(
    nodes: Sequence[Node],
    pods: Sequence[Pod],
    policy: policies.Policy,
    seed: int,
    ratio: float = 1.3,
    on_pod: Callable[[int, int], None] | None = None,
) -> Replay:
    """One seed of the experiment: every arriving pod placed by ``policy`` or dropped."""
    rng = random.Random(seed)
    order = list(range(len(nodes)))
    rng.shuffle(order)
    cluster = Cluster(nodes, policy, order, seed=rng.randrange(2**32))
    result = Replay(capacity_milli=sum(n.gpus for n in nodes) * frag.MILLI)
    sequence = arrivals(pods, result.capacity_milli, rng, ratio)
    arrived = allocated = 0
    clock = time.perf_counter
    for step, i in enumerate(sequence):
        pod = pods[i]
        arrived += pod.shape.total_gpu_milli
        started = clock()
        decision = cluster.decide(pod)
        result.seconds += clock() - started
        if decision is not None:
            cluster.bind(pod, decision)
            allocated += pod.shape.total_gpu_milli
            result.placed += 1
        result.arrived.append(arrived)
        result.allocated.append(allocated)
        if on_pod is not None:
            on_pod(step, len(sequence))
    result.left = leftover(cluster, pods)
    return result
