"""Preemption, kube-scheduler's post-filter: where a group that fits nowhere may make room (CONTRACT §8).

Only whole groups of strictly lower priority are victims (pods outside deviceshare groups never are:
they are not among the :class:`victims.BoundGroup` records the caller gives), never one of equal or
higher priority, never a *protected* one (e.g. a PodDisruptionBudget refused its eviction). The
preemptor needs its devices or shares and the CPU/memory of its pending members (:func:`gang.demand`),
beside what nominations of equal or higher priority keep on the node (:mod:`nominations`). The node is
chosen as CONTRACT §8 says, after kube-scheduler's ``pickOneNodeForPreemption``: the lowest
highest-victim priority, then the fewest victim groups, then the fewest victim pods, then the node
name; on each node the cheapest sufficient set (:mod:`victims`).

One full scan of the nodes and their groups per decision, cheap arithmetic only: what each node could
free at best gives a lower bound of its rank (the priority from which enough *could* be freed, and how
few groups could free it); then nodes are searched in the order of that bound, and the search stops
once no remaining node can beat the best found. The answer is the same as trying every subset of
victims on every node (tests/core/test_preemption_properties.py checks exactly that).
"""

from __future__ import annotations

import collections
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from deviceshare.core import capacity, filters, gang, inventory, nominations, placement, reasons, snapshots, victims

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


@dataclass(frozen=True, slots=True)
class _Bound:
    """A node's rank can be no better than this (from what it could free at best)."""

    no_victim: bool
    priority: int
    groups: int

    def beyond(self, rank: tuple[int, int, int, int, tuple[GroupKey, ...]]) -> bool:
        return (0 if self.no_victim else 1, self.priority, self.groups) > rank[:3]


def decide(
    snapshot: snapshots.LedgerSnapshot,
    request: placement.GroupRequest,
    pending: Sequence[inventory.PodDemand],
    priority: int,
    groups_by_node: Mapping[str, Sequence[BoundGroup]],
    *,
    protected: Collection[GroupKey] = frozenset(),
    nominated: nominations.Nominations = nominations.NONE,
) -> Preemption | NoPreemption:
    """Where the group ``request`` (of ``priority``, pending members ``pending``) may evict, and whom.

    ``groups_by_node`` lists every group bound on each node (all of them: a node's state without some is
    rebuilt from the others); ``snapshot`` is the ledger's, without nominations applied. Whether the
    group may preempt at all (``preemptionPolicy: Never``) is :func:`priority.may_preempt`'s to say.
    """
    demand = gang.demand(pending)
    kept_by_node: dict[str, list[nominations.Nomination]] = collections.defaultdict(list)
    for nomination in nominated.by_group.values():
        if nomination.priority >= priority and nomination.group != request.key:
            kept_by_node[nomination.node].append(nomination)
    counted: collections.Counter[str] = collections.Counter()
    bounded: list[tuple[_Bound, str, snapshots.NodeState, Sequence[BoundGroup], list[BoundGroup]]] = []
    for state in snapshot.nodes.values():
        info = state.info
        if _static_failure(info, request, demand) is not None:
            counted[NOT_HELPFUL] += 1
            continue
        groups = groups_by_node.get(info.name, ())
        kept = kept_by_node.get(info.name, ())
        candidates = victims.candidates_of(groups, priority, protected)
        bound_or_reason = _bound(nominations.withhold(state, kept), request, demand, candidates)
        if isinstance(bound_or_reason, str):
            counted[bound_or_reason if candidates else NO_VICTIMS] += 1
            continue
        bounded.append((bound_or_reason, info.name, state, groups, candidates))
    bounded.sort(key=lambda item: (not item[0].no_victim, item[0].priority, item[0].groups, item[1]))
    best: tuple[tuple[int, int, int, int, tuple[GroupKey, ...]], str, victims.Choice] | None = None
    for bound, name, state, groups, candidates in bounded:
        if best is not None and bound.beyond(best[0]):
            break
        if not victims.consistent(state, groups):
            counted[UNKNOWN_HOLDERS] += 1
            continue
        search = victims.NodeSearch(state, groups, candidates, request, demand, kept_by_node.get(name, ()))
        choice = search.best()
        if choice is None:
            counted[search.failure() or NOT_HELPFUL] += 1
            continue
        if best is None or (choice.rank, name) < (best[0], best[1]):
            best = (choice.rank, name, choice)
    if best is None:
        return NoPreemption(dict(counted), len(snapshot.nodes))
    _, name, choice = best
    return Preemption(name, choice.victims, placement.device_choice(choice.state, request, snapshot.revision))


def _static_failure(
    info: inventory.NodeInfo, request: placement.GroupRequest, demand: inventory.PodDemand
) -> str | None:
    """What no eviction can change: the node's mode, readiness, cordon, taints, selectors, inventory, and
    whether even the empty node has the devices and CPU/memory."""
    devices_check = (lambda: None) if request.share else None
    return filters.first_failure(
        info, info.devices, 0, 0, request.resources, request.node_selector, demand, devices_check
    )


def _usable_now(state: snapshots.NodeState, resource: str, share: capacity.Share | None) -> int:
    free = state.free.get(resource, ())
    if share is None:
        return len(free)
    info = state.info
    fresh = capacity.fresh("", info.device_memory.get(resource), info.device_tiles.get(resource, 0), share.kind)
    fitting = len(free) if capacity.fits(fresh, share) else 0
    return fitting + sum(1 for left in state.partial.get(resource, ()) if capacity.fits(left, share))


def _fewest_to_cover(short: int, amounts: Sequence[int]) -> int:
    """How few of ``amounts`` (largest first) can add up to ``short``."""
    if short <= 0:
        return 0
    total = 0
    for n, amount in enumerate(sorted(amounts, reverse=True), start=1):
        total += amount
        if total >= short:
            return n
    return len(amounts) + 1


def _bound(
    state: snapshots.NodeState,
    request: placement.GroupRequest,
    demand: inventory.PodDemand,
    candidates: Sequence[BoundGroup],
) -> _Bound | str:
    """The best rank the node could reach, counting every device a candidate touches as freed for the
    preemptor (a device becomes usable only when one of its holders leaves), or why it cannot fit."""
    info = state.info
    shorts: list[tuple[str, int, list[int]]] = []
    for resource, count in sorted(request.resources.items()):
        touches = [len(g.allocation.devices.get(resource, ())) for g in candidates]
        usable = _usable_now(state, resource, request.share.get(resource))
        shorts.append((reasons.insufficient(resource), count - usable, touches))
    shorts.append((reasons.INSUFFICIENT_CPU, demand.cpu_milli - (info.cpu_milli - state.cpu_used),
                   [g.cpu_milli for g in candidates]))
    shorts.append((reasons.INSUFFICIENT_MEMORY, demand.memory_bytes - (info.memory_bytes - state.memory_used),
                   [g.memory_bytes for g in candidates]))
    for reason, short, amounts in shorts:
        if short > sum(amounts):
            return reason
    if all(short <= 0 for _, short, _ in shorts):
        return _Bound(True, 0, 0)
    order = sorted(range(len(candidates)), key=lambda i: candidates[i].priority)
    freed = [0] * len(shorts)
    lowest = candidates[order[-1]].priority if order else 0
    for i in order:  # the lowest priority from which enough could be freed
        for j, (_, _, amounts) in enumerate(shorts):
            freed[j] += amounts[i]
        if all(freed[j] >= short for j, (_, short, _) in enumerate(shorts)):
            lowest = candidates[i].priority
            break
    fewest = max(_fewest_to_cover(short, amounts) for _, short, amounts in shorts)
    return _Bound(False, lowest, fewest)
