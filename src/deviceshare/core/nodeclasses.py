"""A cluster's free resources indexed for fast scored placement: nodes grouped by state.

A policy rates node *states* (GPU model, free CPU, multiset of per-GPU free milli), never node
names, and a state's rating for a pod shape never changes. So nodes in the same state form a
class, each (class, shape) pair is rated once for the whole run, and ties go to the class's
first node in a fixed order (the artifact's tie-break). Per pod shape a heap holds the feasible
classes by (score, first node); a placement moves one node between two classes and logs both,
and a shape's heap catches up on the log the next time that shape is placed. A decision thus
costs the changes since the shape was last seen plus a heap pop, not a rating of every node:
:func:`decide_naive` is that naive form, the reference the index is tested and benched against.
A rarely seen shape would have a long log to catch up on, so each placement also catches one
shape up, in turn (:meth:`Cluster._tidy`), and :meth:`Cluster.prepare` rates the target
workload's shapes up front: every decision's catch-up stays bounded.

Memory is a hard filter but in no score, so it is checked per node inside the best class.

The operator rates with the same FGD engine (:mod:`fgd`) through its own index of the ledger's nodes
(:mod:`fgdindex`, :mod:`fgdplacement`): on the same state both choose the same node and GPUs
(``tests/core/test_fgd_agreement.py``).
"""

from __future__ import annotations

import bisect
import heapq
import random
from collections.abc import Collection, Iterable, Sequence
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


@dataclass(slots=True)
class _ShapeIndex:
    seen: int  # position in the cluster's change log already applied
    heap: list[tuple[int, int, int]] = field(default_factory=list)  # (-score, first rank, class id)
    live: dict[int, int] = field(default_factory=dict)  # class id -> first rank of its entry in the heap
    ratings: dict[int, policies.Choice | None] = field(default_factory=dict)  # class id -> rating


_RANDOM_TRIES = 64  # random policy: rejection samples before a full scan


class Cluster:
    """Free resources per node, grouped into state classes; decisions by one policy."""

    def __init__(
        self, nodes: Sequence[Node], policy: policies.Policy, order: Sequence[int], seed: int = 0, tidy: bool = True
    ) -> None:
        self.nodes = nodes
        self.tidy = tidy  # False: shapes catch up only when their pods come (the lazy form, benched)
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
        self._log: list[int] = []  # class ids whose membership changed, in order
        self._index: dict[Shape, _ShapeIndex] = {}
        self._rotation: list[Shape] = []  # shapes with an index, in the order :meth:`bind` tidies them
        self._turn = 0
        for i in range(len(nodes)):
            self._join(i)

    def prepare(self, shapes: Iterable[Shape]) -> None:
        """Rate every class for these shapes now (the target workload's), not on their first pod."""
        if not self.policy.randomized:
            for shape in shapes:
                self._catch_up(shape)

    @property
    def classes(self) -> int:
        return len(self._classes)

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
        self._log.append(cid)

    def _leave(self, node: int) -> None:
        cid = self._class_of[node]
        members = self._classes[cid]
        del members[bisect.bisect_left(members, self.rank[node])]
        if not members:
            del self._classes[cid]
        self._log.append(cid)

    def _rate(self, index: _ShapeIndex, cid: int, shape: Shape) -> policies.Choice | None:
        if cid in index.ratings:
            return index.ratings[cid]
        got = index.ratings[cid] = self.policy.evaluate(self._sigs[cid], shape)
        return got

    def _offer(self, index: _ShapeIndex, cid: int, shape: Shape) -> None:
        members = self._classes.get(cid)
        if members is None or index.live.get(cid) == members[0]:
            return
        got = self._rate(index, cid, shape)
        if got is not None:
            index.live[cid] = members[0]
            heapq.heappush(index.heap, (-got.score, members[0], cid))

    def _catch_up(self, shape: Shape) -> _ShapeIndex:
        """Offer the shape's heap the classes changed since it last looked."""
        index = self._index.get(shape)
        log = self._log
        if index is None:
            index = self._index[shape] = _ShapeIndex(seen=len(log))
            self._rotation.append(shape)
            pending: Collection[int] = list(self._classes)
        else:
            pending = set(log[index.seen :])  # a busy class shows up many times
            index.seen = len(log)
        if len(pending) > len(self._classes):
            index.heap.clear()  # cheaper to start over from the current classes
            index.live.clear()
            pending = list(self._classes)
        elif len(index.heap) > 4 * len(self._classes) + 64:
            # mostly stale entries: keep the live ones (ratings stand), no rating needed
            live, classes = index.live, self._classes
            index.heap = [e for e in index.heap if live.get(e[2]) == e[1] and classes.get(e[2], [-1])[0] == e[1]]
            heapq.heapify(index.heap)
        for cid in pending:
            self._offer(index, cid, shape)
        return index

    def decide(self, pod: Pod) -> Decision | None:
        if self.policy.randomized:
            return self._decide_random(pod)
        shape, need = pod.shape, pod.memory_mib
        index = self._catch_up(shape)
        heap, classes, mem, at_rank = index.heap, self._classes, self.mem, self.at_rank
        best: policies.Choice | None = None
        best_score, best_rank = -1, len(at_rank)
        held = []  # valid entries popped on the way (their first node lacked memory, or was beaten)
        while heap:
            neg, first, cid = heap[0]
            members = classes.get(cid)
            if members is None or members[0] != first or index.live.get(cid) != first:
                heapq.heappop(heap)  # stale: the class changed since (its fresh entry is in the heap)
                if index.live.get(cid) == first:
                    del index.live[cid]
                continue
            if best is not None and (-neg < best_score or first >= best_rank):
                break
            held.append(heapq.heappop(heap))
            for r in members:
                if r >= best_rank:
                    break
                if mem[at_rank[r]] >= need:
                    best, best_score, best_rank = index.ratings[cid], -neg, r
                    break
        for entry in held:
            heapq.heappush(heap, entry)
        if best is None:
            return None
        node = at_rank[best_rank]
        return Decision(node, policies.pick_gpus(self.gpu[node], shape, best))

    def _feasible(self, node: int, pod: Pod, index: _ShapeIndex) -> bool:
        return self.mem[node] >= pod.memory_mib and self._rate(index, self._class_of[node], pod.shape) is not None

    def _decide_random(self, pod: Pod) -> Decision | None:
        """Uniform over the feasible nodes: rejection sampling, then a full scan if that keeps missing."""
        index = self._index.setdefault(pod.shape, _ShapeIndex(seen=0))
        node = -1
        for _ in range(_RANDOM_TRIES):
            candidate = self.rng.randrange(len(self.nodes))
            if self._feasible(candidate, pod, index):
                node = candidate
                break
        else:
            feasible = [n for n in range(len(self.nodes)) if self._feasible(n, pod, index)]
            if not feasible:
                return None
            node = self.rng.choice(feasible)
        return Decision(node, policies.pick_gpus(self.gpu[node], pod.shape, policies.Choice(0), self.rng))

    def bind(self, pod: Pod, decision: Decision) -> None:
        node, gpus = decision.node, self.gpu[decision.node]
        if any(gpus[i] < pod.shape.gpu_milli for i in decision.gpus):
            raise ValueError(f"GPU(s) {decision.gpus} of {self.nodes[node].name} would be over-committed")
        self._leave(node)
        self.cpu[node] -= pod.shape.cpu_milli
        self.mem[node] -= pod.memory_mib
        for i in decision.gpus:
            gpus[i] -= pod.shape.gpu_milli
        self._join(node)
        if self.tidy:
            self._tidy()

    def _tidy(self) -> None:
        """Catch one shape up on the changes, the next in turn, per placement.

        With k shapes known, no shape is more than 2k changes behind, so a rarely seen shape's
        next decision rates at most that many classes, not every class changed since it last
        came (the lazy form's tail: up to all classes). Frequent shapes are caught up by their
        own decisions, so their turn costs little; a rare shape's turn costs what its own
        decision would have.
        """
        if self._rotation:
            self._turn = (self._turn + 1) % len(self._rotation)
            self._catch_up(self._rotation[self._turn])


def decide_naive(cluster: Cluster, pod: Pod, policy: policies.Policy | None = None) -> Decision | None:
    """Rate every node against the pod afresh (no classes): what :meth:`Cluster.decide` avoids.

    ``policy`` defaults to the cluster's; pass one whose measure does not memoise for the truly
    naive cost (every node's fragmentation recomputed per decision).
    """
    policy = cluster.policy if policy is None else policy
    best: tuple[int, int, policies.Choice] | None = None  # (score, -rank, rating)
    node_of_best = -1
    for node in range(len(cluster.nodes)):
        if cluster.mem[node] < pod.memory_mib:
            continue
        got = policy.evaluate(cluster.signature(node), pod.shape)
        if got is None:
            continue
        if best is None or (got.score, -cluster.rank[node]) > best[:2]:
            best, node_of_best = (got.score, -cluster.rank[node], got), node
    if best is None:
        return None
    return Decision(node_of_best, policies.pick_gpus(cluster.gpu[node_of_best], pod.shape, best[2]))
