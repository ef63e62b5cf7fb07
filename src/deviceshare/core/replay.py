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
- **Speed**: a policy rates node *states*, not nodes. Nodes in the same state (GPU model, free
  CPU, multiset of per-GPU free milli) form a class; a decision rates each class once per pod
  shape (memoised for the whole replay, since a state's rating never changes) and takes the
  first node, in the seed's order, of the best class that also has the memory. A placement
  moves one node to another class. :func:`decide_naive` rates every node afresh, for the bench.

For the operator (not wired yet): build a :class:`Cluster` from the ledger's nodes, with the
target workload from a decaying histogram of the group shapes it has seen (seeded from the
current groups at start), and call :meth:`Cluster.decide` per group, then :meth:`Cluster.bind`.
"""

from __future__ import annotations

import bisect
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from deviceshare.core import fragmentation as frag
from deviceshare.core import policies
from deviceshare.core.fragmentation import Shape, Signature


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class Pod:
    shape: Shape
    memory_mib: int


@dataclass(frozen=True, slots=True)
class Decision:
    node: int  # index into the node list
    gpus: tuple[int, ...]


_UNRATED = policies.Choice(-1)  # memo marker: not rated yet


class Cluster:
    """Free resources per node, indexed by state class; decisions by one policy."""

    def __init__(self, nodes: Sequence[Node], policy: policies.Policy, order: Sequence[int], seed: int = 0) -> None:
        self.nodes = nodes
        self.policy = policy
        self.rng = random.Random(seed)
        self.cpu = [n.cpu_milli for n in nodes]
        self.mem = [n.memory_mib for n in nodes]
        self.gpu = [[frag.MILLI] * n.gpus for n in nodes]
        self.rank = [0] * len(nodes)  # position in the tie-break order
        self.at_rank = list(order)
        for position, node in enumerate(order):
            self.rank[node] = position
        self._ids: dict[Signature, int] = {}
        self._sigs: list[Signature] = []
        self._class_of = [0] * len(nodes)
        self._classes: dict[int, list[int]] = {}  # class id -> member ranks, ascending
        self._memo: dict[Shape, dict[int, policies.Choice | None]] = {}
        for i in range(len(nodes)):
            self._join(i)

    def signature(self, node: int) -> Signature:
        return frag.signature_of(self.nodes[node].model, self.cpu[node], self.gpu[node])

    def _join(self, node: int) -> None:
        sig = self.signature(node)
        cid = self._ids.get(sig)
        if cid is None:
            cid = self._ids[sig] = len(self._sigs)
            self._sigs.append(sig)
        self._class_of[node] = cid
        members = self._classes.get(cid)
        if members is None:
            self._classes[cid] = [self.rank[node]]
        else:
            bisect.insort(members, self.rank[node])

    def _leave(self, node: int) -> None:
        cid = self._class_of[node]
        members = self._classes[cid]
        del members[bisect.bisect_left(members, self.rank[node])]
        if not members:
            del self._classes[cid]

    @property
    def classes(self) -> int:
        return len(self._classes)

    def decide(self, pod: Pod) -> Decision | None:
        shape = pod.shape
        memo = self._memo.get(shape)
        if memo is None:
            memo = self._memo[shape] = {}
        evaluate = self.policy.evaluate
        sigs, mem, at_rank, need = self._sigs, self.mem, self.at_rank, pod.memory_mib
        if self.policy.randomized:
            feasible = []
            for cid, members in self._classes.items():
                got = memo.get(cid, _UNRATED)
                if got is _UNRATED:
                    got = memo[cid] = evaluate(sigs[cid], shape)
                if got is not None:
                    feasible.extend(at_rank[r] for r in members if mem[at_rank[r]] >= need)
            if not feasible:
                return None
            node = self.rng.choice(feasible)
            return Decision(node, policies.pick_gpus(self.gpu[node], shape, policies.Choice(0), self.rng))
        best_score, best_rank = -1, len(at_rank)
        best: policies.Choice | None = None
        for cid, members in self._classes.items():
            got = memo.get(cid, _UNRATED)
            if got is _UNRATED:
                got = memo[cid] = evaluate(sigs[cid], shape)
            if got is None:
                continue
            score = got.score
            if score < best_score or (score == best_score and members[0] >= best_rank):
                continue
            for r in members:
                if score == best_score and r >= best_rank:
                    break
                if mem[at_rank[r]] >= need:
                    best_score, best_rank, best = score, r, got
                    break
        if best is None:
            return None
        node = at_rank[best_rank]
        return Decision(node, policies.pick_gpus(self.gpu[node], shape, best))

    def bind(self, pod: Pod, decision: Decision) -> None:
        node = decision.node
        self._leave(node)
        self.cpu[node] -= pod.shape.cpu_milli
        self.mem[node] -= pod.memory_mib
        gpus = self.gpu[node]
        for i in decision.gpus:
            gpus[i] -= pod.shape.gpu_milli
            assert gpus[i] >= 0, "a decision over-committed a GPU"
        self._join(node)


def decide_naive(cluster: Cluster, pod: Pod) -> Decision | None:
    """Rate every node against the pod afresh: the reference :meth:`Cluster.decide` must agree with."""
    best: tuple[int, int, policies.Choice] | None = None
    for node in range(len(cluster.nodes)):
        if cluster.mem[node] < pod.memory_mib:
            continue
        got = cluster.policy.evaluate(cluster.signature(node), pod.shape)
        if got is None:
            continue
        key = (got.score, -cluster.rank[node])
        if best is None or key > (best[0], -cluster.rank[best[1]]):
            best = (got.score, node, got)
    if best is None:
        return None
    return Decision(best[1], policies.pick_gpus(cluster.gpu[best[1]], pod.shape, best[2]))


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


@dataclass(slots=True)
class Replay:
    capacity_milli: int
    arrived: list[int] = field(default_factory=list)  # cumulative GPU milli requested, per pod
    allocated: list[int] = field(default_factory=list)  # GPU milli in use after each pod
    placed: int = 0
    seconds: float = 0.0  # time spent deciding

    def allocated_at(self, percent: int) -> float:
        """GPU share in use (percent of capacity) averaged over the pods whose arrival rounds to ``percent``."""
        cap = self.capacity_milli
        hits = [a for r, a in zip(self.arrived, self.allocated, strict=True) if math.floor(100 * r / cap + 0.5) == percent]
        if not hits:  # the load never got there: the last state before it
            below = [a for r, a in zip(self.arrived, self.allocated, strict=True) if 100 * r / cap <= percent]
            hits = below[-1:] or [0]
        return 100.0 * sum(hits) / len(hits) / cap

    @property
    def decisions_per_second(self) -> float:
        return len(self.arrived) / self.seconds if self.seconds > 0 else 0.0


PolicyFactory = Callable[[], policies.Policy]


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
    return result
