"""``schedulingStrategy: fgd``: the operator's fragmentation-aware placement (FGD, Weng et al. ATC'23, and ours).

A :class:`FGDPlacement` is a :class:`placement.IndexedPolicy` (and, for reference, a plain
:class:`placement.Policy` offered every feasible node: :meth:`FGDPlacement.choose`). It decides with the
FGD engine (:mod:`fgd`, the one ``deviceshare simulate`` decides with; by default its best measured
variant, :data:`fgd.BEST`): for the group's leading resource (its shared resource, else the first by
name) a node's state is FGD's signature: per-device free compute share in milli (a wholly free device
1000, a partly used one what its sharers left, a held device 0) and the node's free CPU, the resource
standing for the GPU model. The engine measures it against the target workload (:mod:`workloadmix`,
learned from the groups placed) and the open nodes' types (resource, device count), and the group goes
where its score is best; equal scores go to the node whose name sorts first, a fixed order that is
itself a packing force.

- A whole-device group takes fully free devices, as ``binpack`` picks them (a contiguous run).
- A compute share on one device takes the device whose free value scores best (first in
  inventory order among equals); on several devices, the tightest ones that fit.
- A share measured only in memory or tiles has no compute to weigh: the node and devices come
  from ``binpack``'s order among the feasible nodes.

Many nodes are in the same state, so the decision rates *classes* of nodes (:mod:`fgdindex`, kept
current from the snapshot's shards), each once per group shape for as long as the measure holds
(when the mix moves, the next measure is rated a few classes per decision, :mod:`fgdratings`); a
node's signature is cached against its (immutable, replaced on change) ledger state, its free CPU
counted up to the measure's horizon (:meth:`fgd.Measure.cpu_horizon`). The naive form
(:meth:`FGDPlacement.choose`) still rates each distinct state only once per decision.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from deviceshare.core import fgd, fgdgroups, fgdindex, fgdratings, inventory, linkscore, shareplacement, workloadmix
from deviceshare.core import fragmentation as frag
from deviceshare.core import ledger as ledgers
from deviceshare.core import placement as placements

_Rating = fgdratings.Rating
REFRESH = 200  # placements after which the measure follows the drifted mix
# the group's side of the translation, re-exported for the operator (runtime.py) and tests
lead_resource, shape_of, seed_histogram = fgdgroups.lead_resource, fgdgroups.shape_of, fgdgroups.seed_histogram


class FGDPlacement:
    """The ``fgd`` strategy: FGD's node and device choice against a learned target workload."""

    def __init__(
        self, histogram: workloadmix.ShapeHistogram | None = None, refresh: int = REFRESH, variant: str = fgd.BEST
    ) -> None:
        if refresh < 1:
            raise ValueError(f"refresh must be at least 1 placement, got {refresh}")
        if variant not in fgd.VARIANTS:
            raise ValueError(f"unknown FGD variant {variant!r} (known: {', '.join(fgd.VARIANTS)})")
        self.refresh = refresh
        self.histogram = histogram if histogram is not None else workloadmix.ShapeHistogram()
        self._observed = 0  # placements seen since the current mix was last looked at
        self._signatures: dict[tuple[str, str], tuple[ledgers.NodeState, frag.Signature]] = {}
        self._signature_room = 0  # entries the cache may hold before nodes are counted again
        self._classes: dict[str, fgdindex.SignatureClasses] = {}
        # the active measure and its ratings, and the next one rated a few per decision
        # the rating looked up per call, so that a test can count them
        self.ratings = fgdratings.Ratings(
            lambda measure, sig, shape: fgdratings.rate(measure, sig, shape), variant=fgd.VARIANTS[variant]
        )
        self._fresh_shape = False  # a shape never seen before was placed since the mix was last looked at
        self._cpu_cap = 1  # signatures clamp free CPU here (see :meth:`_clamp`)
        self._shape_cpu = 0  # the most CPU of any GPU shape seen (decided or placed)
        self._horizons: dict[tuple[fgd.Measure, int], int] = {}  # (a book's measure, devices) -> its CPU horizon
        for seen in self.histogram.weights():
            self._cover(seen)

    def observe(self, request: placements.GroupRequest, cpu_milli: int) -> None:
        """A group was placed (by any strategy): its shape joins the target workload."""
        shape = shape_of(request.resources, request.share, cpu_milli)
        if shape is not None:
            self._cover(shape)
            self._fresh_shape |= shape not in self.histogram
            self.histogram.observe(shape)
            self._observed += 1
        # Between placements, never during a decision: every decision until the next placement,
        # indexed or naive, sees the same measure.
        if self.ratings.swap_if_ready():
            self._loosen()
        if self.ratings.active is not None and self.ratings.pending is None and (
            self._fresh_shape or self._observed >= self.refresh
        ):
            self._propose()

    def _cover(self, shape: frag.Shape) -> None:
        if shape.num_gpu:
            self._shape_cpu = max(self._shape_cpu, shape.cpu_milli)

    def _devices(self) -> int:
        return max((c.devices for c in self._classes.values()), default=1)

    def _needed(self, devices: int) -> int:
        """The clamp the active and the pending measure need on nodes of up to ``devices`` devices."""
        needed = self._shape_cpu
        for book in (self.ratings.active, self.ratings.pending):
            if book is not None:
                key = (book.measure, devices)
                horizon = self._horizons.get(key)
                if horizon is None:
                    if len(self._horizons) > 64:
                        self._horizons.clear()
                    horizon = self._horizons[key] = book.measure.cpu_horizon(devices)
                needed = max(needed, horizon + self._shape_cpu)
        return needed

    def _loosen(self) -> None:
        """A new measure took over: if it needs a clamp four times lower (an early mix, its CPU per GPU far
        from today's, had raised it), lower it and start the index over, so that classes share again."""
        needed = self._needed(self._devices())
        if 4 * needed <= self._cpu_cap:
            cap = 1
            while needed > cap:
                cap *= 2
            self._cpu_cap = cap
            self._signatures.clear()
            self._classes.clear()
            self.ratings.clear()

    def _clamp(self, devices: int) -> bool:
        """Keep the CPU clamp of signatures past every rating's reach; True if it had to rise.

        A rating sees a node's free CPU only up to the measure's horizon (:meth:`fgd.Measure.cpu_horizon`:
        which workload shapes fit, how many sharers the node could host, what its idle GPU needs) plus
        the rated shape's CPU; past it, more free CPU changes nothing, so nodes that differ only there
        share a class (and a rating): most of a cluster's nodes. The clamp covers the active and the
        pending measure on nodes of up to ``devices`` devices and the largest shape seen; when it must
        rise (to a power of two) the index starts over.
        """
        needed = self._needed(devices)
        if needed <= self._cpu_cap:
            return False
        while needed > self._cpu_cap:
            self._cpu_cap *= 2
        self._signatures.clear()
        self._classes.clear()
        self.ratings.clear()
        return True

    def _index(self, snapshot: ledgers.LedgerSnapshot, resource: str) -> fgdindex.SignatureClasses:
        """The resource's classes, caught up with ``snapshot`` under a clamp that covers every measure."""
        if len(self._signatures) > self._signature_room:  # counting nodes costs: only past the last count
            self._signature_room = 4 * len(snapshot.nodes) + 64
            if len(self._signatures) > self._signature_room:
                self._signatures.clear()  # nodes came and went: drop the dead entries
        while True:
            classes = self._classes.get(resource)
            if classes is not None and len(classes.signatures) > 4 * len(classes.classes) + 4096:
                classes = None  # states long gone pile up as ids: start the index over
                self.ratings.clear()
            if classes is None:
                classes = self._classes[resource] = fgdindex.SignatureClasses(
                    resource, lambda state: self.signature(state, resource)
                )
            classes.update(snapshot)
            self.measure()
            if not self._clamp(self._devices()):
                return classes

    def _node_types(self) -> tuple[tuple[fgd.NodeType, tuple[int, int]], ...]:
        return tuple(sorted(t for index in self._classes.values() for t in index.node_types()))

    def _propose(self) -> None:
        """Hand the current mix to the ratings (rated in the background, or at once if none is active)."""
        weights = self.histogram.weights()
        expected = sorted(weights, key=lambda s: -weights[s])  # the frequent shapes' turns come first
        self.ratings.propose((self.histogram.workload(), self._node_types()), expected)
        self._observed, self._fresh_shape = 0, False

    def measure(self) -> fgd.Measure:
        """The measure decisions use now: the target workload's and the node types' as of the last switch.

        The mix is looked at again when a shape new to the histogram was placed, or after
        ``refresh`` placements (shapes that faded out leave then; the node types are taken anew then
        too): weights drift with every placement, and re-rating every node state for a drift of a
        fraction of a percent would cost more than it changes. A changed mix is rated in the
        background and takes over once done (:mod:`fgdratings`); the first decision takes the mix as
        it is.
        """
        if self.ratings.active is None:
            self._propose()
        assert self.ratings.active is not None
        return self.ratings.active.measure

    def place(
        self,
        snapshot: ledgers.LedgerSnapshot,
        request: placements.GroupRequest,
        pod: inventory.PodDemand,
        fits: Callable[[ledgers.NodeState], bool],
    ) -> placements.Placement | placements.Unschedulable:
        """The indexed decision: the same choice as :meth:`choose` over every feasible node.

        Classes of open nodes in the same state (:mod:`fgdindex`) are rated, once per state and
        shape while the mix holds; then, best score first, the classes of one score are walked in
        node-name order and the first node that passes every filter (selector, taints, memory...)
        takes the group.
        """
        resource = lead_resource(request)
        shape = shape_of(request.resources, request.share, pod.cpu_milli)
        if resource is None or shape is None or shape.num_gpu == 0:  # nothing for FGD to weigh: binpack
            return placements.place_on(snapshot, request, pod)
        self._cover(shape)
        classes = self._index(snapshot, resource)
        measure = self.measure()
        self.ratings.tend(self._classes)
        book = self.ratings.active
        assert book is not None
        ratings = book.ratings.setdefault(shape, {})
        signatures = classes.signatures
        rated = []
        for cid, members in classes.classes.items():
            try:
                got = ratings[cid]
            except KeyError:
                got = ratings[cid] = fgdratings.rate(measure, signatures[cid], shape)
            if got is not None:
                rated.append((-got[0], members[0], cid))
        book.marks[shape] = len(signatures)  # every open class is rated: its catch-up starts from here
        rated.sort()
        nodes = snapshot.nodes
        i = 0
        while i < len(rated):
            j = i
            while j < len(rated) and rated[j][0] == rated[i][0]:
                j += 1
            level = [classes.classes[cid] for _, _, cid in rated[i:j]]
            walk = (nodes[name] for name in (heapq.merge(*level) if len(level) > 1 else level[0]))
            for state in walk:
                if fits(state):
                    if linkscore.applies(snapshot, request.resources) and not request.share:
                        state = linkscore.prefer(state, walk, lambda s: 0, fits, request.resources)
                    got = ratings[classes.class_of(state.info.name)]
                    assert got is not None
                    return self._placement(snapshot, request, state, resource, shape, got)
            i = j
        return placements.explain(snapshot, request, pod)

    def signature(self, state: ledgers.NodeState, resource: str) -> frag.Signature:
        key = (state.info.name, resource)
        cached = self._signatures.get(key)
        if cached is not None and cached[0] is state:
            return cached[1]
        values = fgdgroups.free_values(state, resource).values()
        sig = frag.signature_of(resource, min(state.info.cpu_milli - state.cpu_used, self._cpu_cap), values)
        self._signatures[key] = (state, sig)
        return sig

    def for_pod(self, pod: inventory.PodDemand) -> placements.Policy:
        """The policy for one decision: the group's shape takes its first pod's CPU."""
        return _ForPod(self, pod.cpu_milli)

    def naive_for_pod(self, pod: inventory.PodDemand) -> placements.Policy:
        """The same decision with every feasible node offered, no index: for tests and the bench."""
        return _Naive(self, pod.cpu_milli)

    def choose(
        self,
        snapshot: ledgers.LedgerSnapshot,
        request: placements.GroupRequest,
        feasible: Sequence[ledgers.NodeState],
        cpu_milli: int = 0,
    ) -> placements.Placement | None:
        """The node and devices FGD picks among ``feasible`` (sorted by name) for a pod of ``cpu_milli``."""
        resource = lead_resource(request)
        shape = shape_of(request.resources, request.share, cpu_milli)
        if resource is None or shape is None or shape.num_gpu == 0:
            return self._fallback(snapshot, request, feasible)
        self._cover(shape)
        self._index(snapshot, resource)  # the same clamp and node types as the indexed walk
        measure = self.measure()
        rated: dict[frag.Signature, _Rating | None] = {}
        best: ledgers.NodeState | None = None
        best_rating: _Rating = (-1, ())
        tied: list[ledgers.NodeState] = []  # the feasible nodes of the best score so far, by name
        for state in feasible:  # by name: the first of equal scores wins (unless links tell, linkscore)
            sig = self.signature(state, resource)
            if sig in rated:
                got = rated[sig]
            else:
                got = rated[sig] = fgdratings.rate(measure, sig, shape)
            if got is not None and got[0] > best_rating[0]:
                best, best_rating, tied = state, got, [state]
            elif got is not None and got[0] == best_rating[0]:
                tied.append(state)
        if best is None:
            return self._fallback(snapshot, request, feasible)
        if linkscore.applies(snapshot, request.resources) and not request.share:
            best = linkscore.best_of(tied, request.resources)
            best_rating = rated[self.signature(best, resource)] or best_rating
        return self._placement(snapshot, request, best, resource, shape, best_rating)

    @staticmethod
    def _placement(
        snapshot: ledgers.LedgerSnapshot, request: placements.GroupRequest, state: ledgers.NodeState,
        resource: str, shape: frag.Shape, rating: _Rating,
    ) -> placements.Placement:
        chosen = placements.device_choice(state, request, snapshot.revision)
        if request.share and shape.num_gpu == 1:
            device = fgdgroups.device_for(state, resource, request.share[resource], rating[1])
            if device is not None:
                chosen = placements.Placement(
                    state.info.name, {**chosen.devices, resource: (device,)}, snapshot.revision, chosen.tiles
                )
        return chosen

    @staticmethod
    def _fallback(
        snapshot: ledgers.LedgerSnapshot, request: placements.GroupRequest, feasible: Sequence[ledgers.NodeState]
    ) -> placements.Placement | None:
        """Binpack's order among the feasible nodes (shares without compute, groups without devices)."""
        if not feasible:
            return None
        if request.share:
            state = min(feasible, key=lambda s: (*shareplacement.order_key(s, request.share, False), s.info.name))
        else:
            state = min(
                feasible,
                key=lambda s: (sum(len(s.free.get(r, ())) - n for r, n in request.resources.items()), s.info.name),
            )
        return placements.device_choice(state, request, snapshot.revision)


@dataclass(frozen=True, slots=True)
class _Naive:
    """fgd offered every feasible node (no index): the reference the indexed walk must agree with."""

    policy: FGDPlacement
    cpu_milli: int

    def choose(
        self, snapshot: ledgers.LedgerSnapshot, request: placements.GroupRequest,
        feasible: Sequence[ledgers.NodeState],
    ) -> placements.Placement | None:
        return self.policy.choose(snapshot, request, feasible, self.cpu_milli)


@dataclass(frozen=True, slots=True)
class _ForPod(_Naive):
    def place(
        self, snapshot: ledgers.LedgerSnapshot, request: placements.GroupRequest, pod: inventory.PodDemand,
        fits: Callable[[ledgers.NodeState], bool],
    ) -> placements.Placement | placements.Unschedulable:
        return self.policy.place(snapshot, request, pod, fits)
