"""Preemption, kube-scheduler's post-filter: where a group that fits nowhere may make room (CONTRACT §8).

Only whole groups of strictly lower priority are victims (pods outside deviceshare groups never are:
they are not among the :class:`victims.BoundGroup` records the caller gives), never one of equal or
higher priority, never a *protected* one (e.g. a PodDisruptionBudget refused its eviction). The
preemptor needs its devices or shares and the CPU/memory of its pending members (:func:`gang.demand`),
beside what nominations of equal or higher priority keep on the node (:mod:`nominations`), and only of
the devices it may take (a DRA claim's selectors, :class:`eligibility.Ineligible`): a group holding only
devices the preemptor cannot use is never evicted for it, free or freed. The node is
chosen as CONTRACT §8 says, after kube-scheduler's ``pickOneNodeForPreemption``: the lowest
highest-victim priority, then the fewest victim groups, then the fewest victim pods, then the node
name, then the victims' names; on each node the cheapest sufficient set (:mod:`victims`).

Cheap arithmetic per node (:mod:`preemptionbounds`): what it could free at best, read by binary search
from running totals the caller keeps per node (:class:`victims.NodeGroups`), gives a lower bound of its
rank (the priority from which enough *could* be freed, how few groups could free it); nodes are searched
exactly in the order of that bound, and the search stops once no node left can beat the best found. Given a
:class:`victimindex.VictimIndex` (what the operator keeps), only the nodes whose key in its order could
still win are bounded at all; given a plain mapping, or when no node has victims, every node is (one
scan, the reasons counted). The answer is the same as trying every subset of victims on every node
(tests/core/test_preemption_properties.py checks exactly that, both ways, with claim selectors too).
"""

from __future__ import annotations

import bisect
import collections
import heapq
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from deviceshare.core import (
    eligibility,
    filters,
    gang,
    inventory,
    nominations,
    placement,
    preemptionbounds,
    reasons,
    snapshots,
    victimindex,
    victims,
)

GroupKey = inventory.GroupKey
BoundGroup = victims.BoundGroup

NO_VICTIMS = preemptionbounds.NO_VICTIMS
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
    ineligible: eligibility.Ineligible = eligibility.NONE,
) -> Preemption | NoPreemption:
    """Where the group ``request`` (of ``priority``, pending members ``pending``) may evict, and whom.

    ``groups_by_node`` holds every group bound on each node (:func:`victims.by_node`, or a
    :class:`victimindex.VictimIndex` to skip the scan; all of them: a node's state without some is rebuilt
    from the others); ``snapshot`` is the ledger's, without nominations applied nor devices
    narrowed. ``ineligible``: the devices the preemptor may not take (a DRA claim's selectors do not
    match them): they count as usable neither when free nor once their holders leave, so a victim is
    chosen only for devices the preemptor can use. Whether the group may preempt at all
    (``preemptionPolicy: Never``) is :func:`priority.may_preempt`'s to say.
    """
    scan = _Scan(snapshot, request, gang.demand(pending), priority, groups_by_node, protected, nominated, ineligible)
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
        nominated: nominations.Nominations, ineligible: eligibility.Ineligible,
    ) -> None:
        self.snapshot, self.request, self.demand, self.priority = snapshot, request, demand, priority
        self.groups_by_node, self.protected, self.ineligible = groups_by_node, protected, ineligible
        self.kept_by_node: dict[str, list[nominations.Nomination]] = collections.defaultdict(list)
        for nomination in nominated.by_group.values():
            if nomination.priority >= priority and nomination.group != request.key:
                self.kept_by_node[nomination.node].append(nomination)
        self.needs = [preemptionbounds.Need(r, n, request.share.get(r), snapshot)
                      for r, n in sorted(request.resources.items())]
        self.constrained = bool(
            request.node_selector or demand.node_selector or demand.required_terms or demand.tolerations)
        self.counted: collections.Counter[str] = collections.Counter()
        # The commonest question (devices of one resource, no node constraints, the node's CPU/memory enough) is
        # answered inline in bound(): preemptionbounds.bound's arithmetic for that case, without its calls, as it runs
        # for every node.
        self.single = self.needs[0] if len(self.needs) == 1 and not self.constrained else None

    def bound(self, state: snapshots.NodeState) -> _Candidate | None:
        """The node with a lower bound of its rank; None (its reason counted) when no eviction can help."""
        info, demand, priority, bisect_left = state.info, self.demand, self.priority, bisect.bisect_left
        # What the preemptor could take now: the devices it may not take are not counted free (those its victims
        # hold still are, at most: the bound stays below what the exact search finds).
        offered = self.ineligible.narrow(state) if self.ineligible.by_node else state
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
                lacking = single.count - len(offered.free.get(single.resource, ()))
            else:
                lacking = single.count - single.usable(offered, offered is state)
            m = bisect_left(groups.priorities, priority)
            sums = groups.touches.get(single.resource)
            if lacking <= 0:
                found = preemptionbounds.FITS_NOW
            elif not m:
                found = NO_VICTIMS
            elif sums is None or sums[m] < lacking:
                found = single.reason
            else:
                fewest = -(-lacking // groups.most_touched[single.resource][m])
                found = (1, groups.priorities[bisect_left(sums, lacking, 0, m + 1) - 1], fewest,
                         fewest * groups.fewest_pods[m])
        else:
            found = preemptionbounds.bound(nominations.withhold(offered, kept) if kept else offered,
                                           not kept and offered is state, self.needs, demand, candidates, priority)
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
        kept = self.kept_by_node.get(name, ())
        search = victims.NodeSearch(state, groups.groups, below, self.request, self.demand, kept, self.ineligible)
        choice = search.best()
        if choice is None:
            failure = search.failure() or NOT_HELPFUL
            ineligible = self.ineligible
            if (failure == reasons.insufficient(ineligible.resource) and ineligible.on(name)
                    and victims.NodeSearch(state, groups.groups, below, self.request, self.demand, kept).failure()
                    is None):  # evicting them would free enough, but not of the devices the preemptor may take
                failure = reasons.no_selected_victim_device(ineligible.resource)
            self.counted[failure] += 1
            return best
        if best is None or (choice.rank, name, choice.keys) < best[:3]:
            return (choice.rank, name, choice.keys, choice)
        return best


# (bound of its rank, node name, state, all its groups, the ones that may be evicted): a heap entry
_Candidate = tuple[tuple[int, int, int, int], str, snapshots.NodeState, victims.NodeGroups, victims.NodeGroups]
