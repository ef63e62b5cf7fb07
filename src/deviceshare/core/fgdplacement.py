"""``schedulingStrategy: fgd``: the operator's fragmentation-aware placement (FGD, Weng et al. ATC'23).

A :class:`FGDPlacement` is a :class:`placement.IndexedPolicy` (and, for reference, a plain
:class:`placement.Policy` offered every feasible node: :meth:`FGDPlacement.choose`). For the
group's leading resource (its shared resource, else the first by name) a node's state is FGD's
signature: per-device free compute share in milli (a wholly free device 1000, a partly used one
what its sharers left, a held device 0) and the node's free CPU. The node's fragmentation against the target workload
(:mod:`workloadmix`, learned from the groups placed) is :mod:`fragmentation`'s measure, and the
group goes where FGD's integer score (fragmentation growth, through a sigmoid) is best; equal
scores go to the node whose name sorts first, a fixed order that is itself a packing force.

- A whole-device group takes fully free devices, as ``binpack`` picks them (a contiguous run).
- A compute share on one device takes the device whose free value scores best (first in
  inventory order among equals); on several devices, the tightest ones that fit.
- A share measured only in memory or tiles has no compute to weigh: the node and devices come
  from ``binpack``'s order among the feasible nodes.

Many nodes are in the same state, so the decision rates *classes* of nodes (:mod:`fgdindex`, kept
current from the snapshot's shards), each once per group shape for as long as the measure holds
(when the mix moves, the next measure is rated a few classes per decision, :mod:`fgdratings`); a
node's signature is cached against its (immutable, replaced on change) ledger state. The naive form
(:meth:`FGDPlacement.choose`) still rates each distinct state only once per decision.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from deviceshare.api import models
from deviceshare.core import capacity, fgdindex, fgdratings, inventory, linkscore, shareplacement, workloadmix
from deviceshare.core import fragmentation as frag
from deviceshare.core import ledger as ledgers
from deviceshare.core import placement as placements

_Rating = fgdratings.Rating
REFRESH = 200  # placements after which the measure follows the drifted mix


def lead_resource(request: placements.GroupRequest) -> str | None:
    if request.share:
        return min(request.share)
    return min(request.resources) if request.resources else None


def shape_of(resources: Mapping[str, int], share: Mapping[str, capacity.Share], cpu_milli: int) -> frag.Shape | None:
    """The group's shape on its leading resource; None for a share without a compute part."""
    if share:
        resource = min(share)
        milli = share[resource].compute_milli
        if not milli:
            return None
        return frag.Shape(cpu_milli, min(milli, frag.MILLI), resources[resource], resource)
    if not resources:
        return frag.Shape(cpu_milli, 0, 0, "")
    resource = min(resources)
    return frag.Shape(cpu_milli, frag.MILLI, resources[resource], resource)


def seed_histogram(
    groups: Iterable[tuple[models.GroupSpec, Sequence[inventory.PodDemand]]],
    half_life: float = workloadmix.DEFAULT_HALF_LIFE,
) -> workloadmix.ShapeHistogram:
    """The target workload at start: one count per existing group, CPU from its first member if any."""
    shapes = []
    for spec, pods in groups:
        cpu = pods[0].cpu_milli if pods else 0
        shape = shape_of(dict(spec.resources), capacity.shares_from_spec(spec.share), cpu)
        if shape is not None:
            shapes.append(shape)
    return workloadmix.ShapeHistogram.seeded(shapes, half_life)


def free_values(state: ledgers.NodeState, resource: str) -> dict[str, int]:
    """Device -> free compute milli, in inventory order (held, mixed or tile-split devices: 0)."""
    free = set(state.free.get(resource, ()))
    left = {
        d.device: max(d.compute_milli, 0)
        for d in state.partial.get(resource, ())
        if d.kind is capacity.Kind.SHARED
    }
    return {
        d: frag.MILLI if d in free else left.get(d, 0) for d in state.info.devices.get(resource, ())
    }


class FGDPlacement:
    """The ``fgd`` strategy: FGD's node and device choice against a learned target workload."""

    def __init__(self, histogram: workloadmix.ShapeHistogram | None = None, refresh: int = REFRESH) -> None:
        if refresh < 1:
            raise ValueError(f"refresh must be at least 1 placement, got {refresh}")
        self.refresh = refresh
        self.histogram = histogram if histogram is not None else workloadmix.ShapeHistogram()
        self._observed = 0  # placements seen since the current mix was last looked at
        self._signatures: dict[tuple[str, str], tuple[ledgers.NodeState, frag.Signature]] = {}
        self._signature_room = 0  # entries the cache may hold before nodes are counted again
        self._classes: dict[str, fgdindex.SignatureClasses] = {}
        # the active measure and its ratings, and the next one rated a few per decision
        # the rating looked up per call, so that a test can count them
        self.ratings = fgdratings.Ratings(lambda measure, sig, shape: fgdratings.rate(measure, sig, shape))
        self._fresh_shape = False  # a shape never seen before was placed since the mix was last looked at
        self._cpu_cap = 1  # signatures clamp free CPU here (see :meth:`_cover`)
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
        self.ratings.swap_if_ready()
        if self.ratings.active is not None and self.ratings.pending is None and (
            self._fresh_shape or self._observed >= self.refresh
        ):
            self._propose()

    def _cover(self, shape: frag.Shape) -> None:
        """Keep the CPU clamp of signatures at least twice any GPU shape's CPU seen (decided or placed).

        FGD's measure and a rating see a node's free CPU only through comparisons with shapes' CPU:
        whether the shape fits, and which workload shapes still fit before and after it lands. Past
        the largest workload shape's CPU plus the placed shape's, more free CPU changes nothing,
        so nodes that differ only there share a class (and a rating): most of a cluster's nodes.
        A larger shape raises the clamp (to a power of two) and the index starts over.
        """
        if shape.num_gpu and 2 * shape.cpu_milli > self._cpu_cap:
            while 2 * shape.cpu_milli > self._cpu_cap:
                self._cpu_cap *= 2
            self._signatures.clear()
            self._classes.clear()
            self.ratings.clear()

    def _propose(self) -> None:
        """Hand the current mix to the ratings (rated in the background, or at once if none is active)."""
        weights = self.histogram.weights()
        expected = sorted(weights, key=lambda s: -weights[s])  # the frequent shapes' turns come first
        self.ratings.propose(self.histogram.workload(), expected)
        self._observed, self._fresh_shape = 0, False

    def measure(self) -> frag.Fragmentation:
        """The measure decisions use now: the target workload's as of the last switch.

        The mix is looked at again when a shape new to the histogram was placed, or after
        ``refresh`` placements (shapes that faded out leave then): weights drift with every
        placement, and re-rating every node state for a drift of a fraction of a percent would cost
        more than it changes. A changed mix is rated in the background and takes over once done
        (:mod:`fgdratings`); the first decision takes the mix as it is.
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
        if len(self._signatures) > self._signature_room:  # counting nodes costs: only past the last count
            self._signature_room = 4 * len(snapshot.nodes) + 64
            if len(self._signatures) > self._signature_room:
                self._signatures.clear()  # nodes came and went: drop the dead entries
        classes = self._classes.get(resource)
        if classes is not None and len(classes.signatures) > 4 * len(classes.classes) + 4096:
            classes = None  # states long gone pile up as ids: start the index over
            self.ratings.clear()
        if classes is None:
            classes = self._classes[resource] = fgdindex.SignatureClasses(
                resource, lambda state: self.signature(state, resource)
            )
        classes.update(snapshot)
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
        values = free_values(state, resource).values()
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
        if len(self._signatures) > 4 * len(snapshot.nodes) + 64:
            self._signatures.clear()  # nodes came and went: drop the dead entries
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
            device = _device_for(state, resource, request.share[resource], rating[1])
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


def _device_for(
    state: ledgers.NodeState, resource: str, share: capacity.Share, values: tuple[int, ...]
) -> str | None:
    """The first device (inventory order) with a best-scoring free value that really takes the share."""
    partial = {d.device: d for d in state.partial.get(resource, ())}
    free = set(state.free.get(resource, ()))
    memory_cap, tiles_cap = state.info.device_memory.get(resource), state.info.device_tiles.get(resource, 0)
    for device, value in free_values(state, resource).items():
        if value not in values:
            continue
        left = partial.get(device)
        if left is None and device in free:
            left = capacity.fresh(device, memory_cap, tiles_cap, share.kind)
        if left is not None and capacity.fits(left, share):
            return device
    return None
