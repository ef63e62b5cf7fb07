"""Preemption, kube-scheduler's post-filter: where a group that fits nowhere may make room (CONTRACT §8).

Only whole groups of strictly lower priority are victims (pods outside deviceshare groups never are:
they are not among the :class:`victims.BoundGroup` records the caller gives), never one of equal or
higher priority, never a *protected* one (e.g. a PodDisruptionBudget refused its eviction). The
preemptor needs its devices or shares and the CPU/memory of its pending members (:func:`gang.demand`),
beside what nominations of equal or higher priority keep on the node (:mod:`nominations`). The node is
chosen as CONTRACT §8 says, after kube-scheduler's ``pickOneNodeForPreemption``: the lowest
highest-victim priority, then the fewest victim groups, then the fewest victim pods, then the node
name, then the victims' names; on each node the cheapest sufficient set (:mod:`victims`).

Cheap arithmetic per node: what it could free at best, read by binary search from running totals the
caller keeps per node (:class:`victims.NodeGroups`), gives a lower bound of its rank (the priority from
which enough *could* be freed, how few groups could free it); nodes are searched exactly in the order of
that bound, and the search stops once no node left can beat the best found. Given a
:class:`victimindex.VictimIndex` (what the operator keeps), only the nodes whose key in its order could
still win are bounded at all; given a plain mapping, or when no node has victims, every node is (one
scan, the reasons counted). The answer is the same as trying every subset of victims on every node
(tests/core/test_preemption_properties.py checks exactly that, both ways).
"""

from __future__ import annotations

import bisect
import collections
import heapq
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from deviceshare.core import (
    capacity,
    filters,
    gang,
    inventory,
    nominations,
    placement,
    reasons,
    snapshots,
    victimindex,
    victims,
)

GroupKey = inventory.GroupKey
BoundGroup = victims.BoundGroup

NO_VICTIMS = "No preemption victims found for incoming pod"
NOT_HELPFUL = "Preemption is not helpful for scheduling"
UNKNOWN_HOLDERS = "node(s) hold devices of groups preemption was not told about"
NEVER = "not eligible due to preemptionPolicy=Never"


@dataclass(frozen=True, slots=True)
class Preemption:
    """Evict ``victims`` (whole groups, on ``node``); the preemptor then takes ``placement`` there."""

    node: str
    victims: tuple[BoundGroup, ...]  # sorted by key
    placement: placement.Placement

    @property
    def victim_keys(self) -> tuple[GroupKey, ...]:
        return tuple(v.key for v in self.victims)

    @property
    def highest_priority(self) -> int | None:
        return max((v.priority for v in self.victims), default=None)

    @property
    def victim_pods(self) -> int:
        return sum(v.pods for v in self.victims)


@dataclass(frozen=True, slots=True)
class NoPreemption:
    """No node where evicting lower-priority groups makes room; counted per node, kube-scheduler style."""

    reasons: Mapping[str, int]
    total_nodes: int

    def message(self) -> str:
        """``preemption: 0/12 nodes are available: 7 No preemption victims found for incoming pod, ...``"""
        counted = ", ".join(f"{n} {reason}" for reason, n in sorted(self.reasons.items()))
        return f"preemption: 0/{self.total_nodes} nodes are available: {counted or reasons.NO_NODES}."


def decide(
    snapshot: snapshots.LedgerSnapshot,
    request: placement.GroupRequest,
    pending: Sequence[inventory.PodDemand],
    priority: int,
    groups_by_node: Mapping[str, victims.NodeGroups],
    *,
    protected: Collection[GroupKey] = frozenset(),
    nominated: nominations.Nominations = nominations.NONE,
) -> Preemption | NoPreemption:
    """Where the group ``request`` (of ``priority``, pending members ``pending``) may evict, and whom.

    ``groups_by_node`` holds every group bound on each node (:func:`victims.by_node`, or a
    :class:`victimindex.VictimIndex` to skip the scan; all of them: a node's state without some is rebuilt
    from the others); ``snapshot`` is the ledger's, without
    nominations applied. Whether the group may preempt at all (``preemptionPolicy: Never``) is
    :func:`priority.may_preempt`'s to say.
    """
    scan = _Scan(snapshot, request, gang.demand(pending), priority, groups_by_node, protected, nominated)
    best: _Best | None = None
    if isinstance(groups_by_node, victimindex.VictimIndex) and request.resources:
        resource = min(request.resources)  # any one resource's key bounds the rank from below
        best = scan.walk(groups_by_node.order(
            snapshot, resource, victimindex.mode_of(request.share.get(resource)), request.resources[resource]))
        scan.counted.clear()  # found nowhere: the scan below counts every node's reason
    if best is None:
        bounded = [found for state in snapshot.nodes.values() if (found := scan.bound(state)) is not None]
        heapq.heapify(bounded)
        best = scan.search(bounded)
    if best is None:
        return NoPreemption(dict(scan.counted), len(snapshot.nodes))
    _, name, _, choice = best
    return Preemption(name, choice.victims, placement.device_choice(choice.state, request, snapshot.revision))


# (the rank of the best victim set found, its node, its victims' keys, the choice)
_Best = tuple[tuple[int, int, int, int], str, tuple[GroupKey, ...], victims.Choice]


class _Scan:
    """One decision's questions of a node: a bound of its rank (:meth:`bound`), then an exact search."""

    def __init__(
        self, snapshot: snapshots.LedgerSnapshot, request: placement.GroupRequest, demand: inventory.PodDemand,
        priority: int, groups_by_node: Mapping[str, victims.NodeGroups], protected: Collection[GroupKey],
        nominated: nominations.Nominations,
    ) -> None:
        self.snapshot, self.request, self.demand, self.priority = snapshot, request, demand, priority
        self.groups_by_node, self.protected = groups_by_node, protected
        self.kept_by_node: dict[str, list[nominations.Nomination]] = collections.defaultdict(list)
        for nomination in nominated.by_group.values():
            if nomination.priority >= priority and nomination.group != request.key:
                self.kept_by_node[nomination.node].append(nomination)
        self.needs = [_Need(r, n, request.share.get(r), snapshot) for r, n in sorted(request.resources.items())]
        self.constrained = bool(
            request.node_selector or demand.node_selector or demand.required_terms or demand.tolerations)
        self.counted: collections.Counter[str] = collections.Counter()
        # The commonest question (devices of one resource, no node constraints, the node's CPU/memory enough) is
        # answered inline in bound(): _bound's arithmetic for that case, without its calls, as it runs for every node.
        self.single = self.needs[0] if len(self.needs) == 1 and not self.constrained else None

    def bound(self, state: snapshots.NodeState) -> _Candidate | None:
        """The node with a lower bound of its rank; None (its reason counted) when no eviction can help."""
        info, demand, priority, bisect_left = state.info, self.demand, self.priority, bisect.bisect_left
        cpu, memory = demand.cpu_milli, demand.memory_bytes
        if self.constrained or info.taints or info.problems or not (info.shared and info.ready) or info.unschedulable:
            static_ok = filters.passes(info, info.devices, 0, 0, {}, self.request.node_selector, demand)
        else:  # the common node, open and untainted: only its size could rule it out
            static_ok = cpu <= info.cpu_milli and memory <= info.memory_bytes
        if not static_ok:
            self.counted[NOT_HELPFUL] += 1  # not even the empty node would do: no eviction can help
            return None
        name = info.name
        groups = self.groups_by_node.get(name, victims.EMPTY)
        candidates = groups
        protected = self.protected
        if protected and not groups.keys.isdisjoint(protected):
            candidates = victims.NodeGroups.of(g for g in groups.groups if g.key not in protected)
        kept = self.kept_by_node.get(name) if self.kept_by_node else None
        found: tuple[int, int, int, int] | str
        single = self.single
        if (single is not None and not kept and candidates is groups
                and cpu <= info.cpu_milli - state.cpu_used and memory <= info.memory_bytes - state.memory_used):
            if single.share is None:
                lacking = single.count - len(state.free.get(single.resource, ()))
            else:
                lacking = single.count - single.usable(state, True)
            m = bisect_left(groups.priorities, priority)
            sums = groups.touches.get(single.resource)
            if lacking <= 0:
                found = _FITS_NOW
            elif not m:
                found = NO_VICTIMS
            elif sums is None or sums[m] < lacking:
                found = single.reason
            else:
                fewest = -(-lacking // groups.most_touched[single.resource][m])
                found = (1, groups.priorities[bisect_left(sums, lacking, 0, m + 1) - 1], fewest,
                         fewest * groups.fewest_pods[m])
        else:
            found = _bound(nominations.withhold(state, kept) if kept else state, not kept, self.needs, demand,
                           candidates, priority)
        if found.__class__ is str:
            self.counted[found] += 1
            return None
        return found, name, state, groups, candidates  # type: ignore[return-value]

    def search(self, bounded: list[_Candidate], best: _Best | None = None) -> _Best | None:
        """Search the nodes of the heap ``bounded`` exactly, in the order of their bounds, while one could
        still beat ``best``."""
        while bounded:
            bound, name, state, groups, candidates = heapq.heappop(bounded)
            if best is not None and (bound, name) > (best[0], best[1]):
                break  # in the order of their bounds: no node left can beat the best
            best = self._exact(name, state, groups, candidates, best)
        return best

    def walk(self, order: Sequence[tuple[tuple[int, int, int, int], str]]) -> _Best | None:
        """The best victim set among the nodes of a :class:`victimindex.VictimIndex` order, which lists every
        node that could give the request's devices of one resource, by a key never above its bound: nodes
        are taken from it while their key could beat the best found or the next bound to search, so only
        those are bounded and searched. None when no node in the order can take the request."""
        nodes, priority = self.snapshot.nodes, self.priority
        heap: list[_Candidate] = []
        best: _Best | None = None
        i, n = 0, len(order)
        while True:
            while i < n and (not heap or order[i] < heap[0][:2]):
                key, name = order[i]
                if (key[0] and key[1] >= priority) or (best is not None and (key, name) > (best[0], best[1])):
                    i = n  # victims of the preemptor's priority or more from here on, or none can beat the best
                    break
                i += 1
                state = nodes.get(name)
                found = None if state is None else self.bound(state)
                if found is not None and (best is None or (found[0], name) < (best[0], best[1])):
                    heapq.heappush(heap, found)
            if not heap:
                return best
            bound, name, state, groups, candidates = heapq.heappop(heap)
            if best is not None and (bound, name) > (best[0], best[1]):
                return best  # every node not searched has a key, or a bound, after this one
            best = self._exact(name, state, groups, candidates, best)

    def _exact(
        self, name: str, state: snapshots.NodeState, groups: victims.NodeGroups, candidates: victims.NodeGroups,
        best: _Best | None,
    ) -> _Best | None:
        if not victims.consistent(state, groups.groups):
            self.counted[UNKNOWN_HOLDERS] += 1
            return best
        below = candidates.groups[: bisect.bisect_left(candidates.priorities, self.priority)]
        search = victims.NodeSearch(state, groups.groups, below, self.request, self.demand,
                                    self.kept_by_node.get(name, ()))
        choice = search.best()
        if choice is None:
            self.counted[search.failure() or NOT_HELPFUL] += 1
            return best
        if best is None or (choice.rank, name, choice.keys) < best[:3]:
            return (choice.rank, name, choice.keys, choice)
        return best


class _Need:
    """One resource of the request, and how many of a node's devices could take it right now.

    For a share, the partly used devices that fit are found once per decision from the snapshot's
    index of partly used devices (open nodes only), not device by device on every node."""

    def __init__(self, resource: str, count: int, share: capacity.Share | None, snapshot: snapshots.LedgerSnapshot):
        self.resource, self.count, self.share = resource, count, share
        self.reason = reasons.insufficient(resource)
        self._fresh: dict[tuple[int | None, int], bool] = {}
        self._partial: collections.Counter[str] = collections.Counter()
        if share is None:
            return
        nodes = snapshot.nodes
        for _, (name, device) in snapshot.part_candidates(resource, snapshots.dimension(share), snapshots.need(share)):
            state = nodes.get(name)
            left = next((x for x in state.partial.get(resource, ()) if x.device == device), None) if state else None
            if left is not None and capacity.fits(left, share):
                self._partial[name] += 1

    def usable(self, state: snapshots.NodeState, indexed: bool) -> int:
        """Devices of the node that could take the resource now (``indexed``: the node's state is the
        snapshot's own, so the index of partly used devices speaks for it)."""
        free = state.free.get(self.resource, ())
        share = self.share
        if share is None:
            return len(free)
        info = state.info
        caps = (info.device_memory.get(self.resource), info.device_tiles.get(self.resource, 0))
        fresh = self._fresh.get(caps)
        if fresh is None:
            fresh = self._fresh[caps] = capacity.fits(capacity.fresh("", caps[0], caps[1], share.kind), share)
        fitting = len(free) if fresh else 0
        if indexed:
            return fitting + self._partial.get(info.name, 0)
        return fitting + sum(1 for left in state.partial.get(self.resource, ()) if capacity.fits(left, share))


def _bound(
    state: snapshots.NodeState,
    indexed: bool,
    needs: Sequence[_Need],
    demand: inventory.PodDemand,
    groups: victims.NodeGroups,
    priority: int,
) -> tuple[int, int, int, int] | str:
    """The best rank (:attr:`victims.Choice.rank`) the node could reach, counting every device a
    candidate holds as freed for the preemptor (a device becomes usable only when one of its holders
    leaves) and the largest candidate for how few could free it; or why it cannot fit at all.
    (Run once per node per decision: written for speed, no intermediate collections.)"""
    m = bisect.bisect_left(groups.priorities, priority)  # the candidates: strictly lower priority
    enough = fewest = 0  # how many candidates, by priority, could free enough; how few could at best
    short = False
    for need in needs:
        if need.share is None:
            lacking = need.count - len(state.free.get(need.resource, ()))
        else:
            lacking = need.count - need.usable(state, indexed)
        if lacking > 0:
            if not m:
                return NO_VICTIMS
            sums = groups.touches.get(need.resource)
            if sums is None or sums[m] < lacking:
                return need.reason
            enough = max(enough, bisect.bisect_left(sums, lacking, 0, m + 1))
            fewest = max(fewest, -(-lacking // groups.most_touched[need.resource][m]))
            short = True
    info = state.info
    lacking = demand.cpu_milli - info.cpu_milli + state.cpu_used
    if lacking > 0:
        if not m:
            return NO_VICTIMS
        if groups.cpu[m] < lacking:
            return reasons.INSUFFICIENT_CPU
        enough = max(enough, bisect.bisect_left(groups.cpu, lacking, 0, m + 1))
        fewest = max(fewest, -(-lacking // groups.most_cpu[m]))
        short = True
    lacking = demand.memory_bytes - info.memory_bytes + state.memory_used
    if lacking > 0:
        if not m:
            return NO_VICTIMS
        if groups.memory[m] < lacking:
            return reasons.INSUFFICIENT_MEMORY
        enough = max(enough, bisect.bisect_left(groups.memory, lacking, 0, m + 1))
        fewest = max(fewest, -(-lacking // groups.most_memory[m]))
        short = True
    if not short:
        return _FITS_NOW
    return (1, groups.priorities[enough - 1], fewest, fewest * groups.fewest_pods[m])


_FITS_NOW = (0, 0, 0, 0)
# (bound of its rank, node name, state, all its groups, the ones that may be evicted): a heap entry
_Candidate = tuple[tuple[int, int, int, int], str, snapshots.NodeState, victims.NodeGroups, victims.NodeGroups]
