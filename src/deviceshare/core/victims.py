"""Which lower-priority groups to evict on one node so that a preemptor fits there (preemption, per node).

A node's state without some groups is rebuilt from the allocations of the groups bound there with the
ledger's own rules (:mod:`holdings`: what a device has left once holders leave), then the nominations
the preemptor must respect are withheld (:mod:`nominations`), and the placement filters decide
(:func:`placement.fits`): one engine, whether the question is "does it fit now" or "would it fit
without these groups".

The cheapest sufficient set is ranked as CONTRACT §8 ranks nodes: the lowest highest-victim priority,
then the fewest groups, then the fewest pods, then the names. kube-scheduler's *reprieve* pass (evict
every lower-priority pod, then take back the most important first while the preemptor still fits)
finds the lowest highest-victim priority exactly, since fitting only gets easier as more is evicted;
it does not find the fewest groups (a node with two 1-GPU groups and one 2-GPU group of one priority
loses the two small ones when they come first). So within that priority the fewest groups are found
by the structure of a fit: the preemptor needs so many usable devices of each resource, and a device
becomes usable when some of *its* holders leave (all of a whole holder; enough sharers for a share),
then the CPU/memory of its pods. The minimal sets that unlock each device are combined for the
devices chosen, topped up for CPU/memory, and the best union is checked once more with the filters.
Searches beyond :data:`SEARCH_BUDGET` combinations take kube's reprieve result instead.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from deviceshare.core import capacity, claims, eligibility, holdings, inventory, nominations, placement, snapshots

GroupKey = inventory.GroupKey
SEARCH_BUDGET = 20_000  # combinations tried on one node before falling back to the reprieve pass
MAX_SHARERS_SEARCHED = 10  # sharers of one device whose subsets are tried; beyond, all of them go


@dataclass(frozen=True, slots=True)
class BoundGroup:
    """A group bound on a node as preemption weighs it: what it holds, its priority, its pods there."""

    allocation: claims.Allocation
    priority: int
    pods: int = 0  # member pods on the node (all evicted with the group)
    cpu_milli: int = 0  # what those pods request
    memory_bytes: int = 0

    @property
    def key(self) -> GroupKey:
        return self.allocation.group

    @property
    def node(self) -> str:
        return self.allocation.node


@dataclass(frozen=True, slots=True)
class NodeGroups:
    """The groups bound on one node, by priority, with running totals: what the preemption scan reads.

    The operator keeps one per node (:func:`by_node`) and replaces it when a group binds there or leaves;
    the scan then bounds a node from a binary search over these totals instead of walking its groups.
    ``cpu``/``memory``/``touches`` hold prefix sums (entry ``i``: the first ``i`` groups), ``most_*`` and
    ``fewest_pods`` prefix maxima and minima.
    """

    groups: tuple[BoundGroup, ...]  # by (priority, key)
    priorities: tuple[int, ...]
    keys: frozenset[GroupKey]
    cpu: tuple[int, ...]
    memory: tuple[int, ...]
    touches: Mapping[str, tuple[int, ...]]  # resource -> prefix sums of the devices each group holds
    most_cpu: tuple[int, ...]
    most_memory: tuple[int, ...]
    most_touched: Mapping[str, tuple[int, ...]]
    fewest_pods: tuple[int, ...]

    @classmethod
    def of(cls, groups: Iterable[BoundGroup]) -> NodeGroups:
        ordered = tuple(sorted(groups, key=lambda g: (g.priority, g.key)))
        resources = sorted({r for g in ordered for r in g.allocation.devices})
        touched = {r: [len(g.allocation.devices.get(r, ())) for g in ordered] for r in resources}
        return cls(
            ordered,
            tuple(g.priority for g in ordered),
            frozenset(g.key for g in ordered),
            _running(sum, [g.cpu_milli for g in ordered]),
            _running(sum, [g.memory_bytes for g in ordered]),
            {r: _running(sum, amounts) for r, amounts in touched.items()},
            _running(max, [g.cpu_milli for g in ordered]),
            _running(max, [g.memory_bytes for g in ordered]),
            {r: _running(max, amounts) for r, amounts in touched.items()},
            _running(min, [g.pods for g in ordered], start=1 << 30),
        )


def _running(step: Callable[[Iterable[int]], int], values: Sequence[int], start: int = 0) -> tuple[int, ...]:
    out, acc = [start], start
    for value in values:
        acc = step((acc, value))
        out.append(acc)
    return tuple(out)


EMPTY = NodeGroups.of(())


def by_node(groups: Iterable[BoundGroup]) -> dict[str, NodeGroups]:
    """Bound groups filed by node, as :func:`preemption.decide` reads them."""
    found: dict[str, list[BoundGroup]] = {}
    for group in groups:
        found.setdefault(group.node, []).append(group)
    return {node: NodeGroups.of(gs) for node, gs in found.items()}


@dataclass(frozen=True, slots=True)
class Choice:
    """The victims on one node (sorted by key) and the node as the preemptor then sees it."""

    victims: tuple[BoundGroup, ...]
    state: snapshots.NodeState

    @property
    def highest(self) -> int | None:
        return max((v.priority for v in self.victims), default=None)

    @property
    def pods(self) -> int:
        return sum(v.pods for v in self.victims)

    @property
    def keys(self) -> tuple[GroupKey, ...]:
        return tuple(v.key for v in self.victims)

    @property
    def rank(self) -> tuple[int, int, int, int]:
        """Smaller is better: no victim at all first, then CONTRACT §8's order (then the node's name, then
        the victims' names break ties)."""
        highest = self.highest
        return (0 if highest is None else 1, highest or 0, len(self.victims), self.pods)


def without(
    state: snapshots.NodeState, groups: Iterable[BoundGroup], removed: Collection[GroupKey]
) -> snapshots.NodeState:
    """The node as if the ``removed`` groups (and their pods) were gone, from the allocations of the
    groups bound there; with nothing removed it equals the ledger's state when ``groups`` are all of them."""
    held: holdings.Held = {}
    uses: holdings.Uses = {}
    cpu, memory = state.cpu_used, state.memory_used
    for group in groups:
        if group.key in removed:
            cpu -= group.cpu_milli
            memory -= group.memory_bytes
        else:
            holdings.hold(held, uses, group.allocation)
    free, partial = holdings.left_on(state.info.name, state.info, held, uses)
    return snapshots.NodeState(state.info, free, cpu, memory, partial)


def consistent(state: snapshots.NodeState, groups: Iterable[BoundGroup]) -> bool:
    """Do ``groups`` account for everything the ledger shows held on the node? (Else no search there.)"""
    rebuilt = without(state, groups, ())
    return dict(rebuilt.free) == dict(state.free) and dict(rebuilt.partial) == dict(state.partial)


class NodeSearch:
    """The best victim set on one node for a preemptor (``request`` with its pending pods' ``demand``); a device it
    may not take (``ineligible``: its claim's selectors do not match) never counts, free or freed."""

    def __init__(
        self,
        state: snapshots.NodeState,
        groups: Sequence[BoundGroup],
        candidates: Sequence[BoundGroup],
        request: placement.GroupRequest,
        demand: inventory.PodDemand,
        kept: Sequence[nominations.Nomination] = (),
        ineligible: eligibility.Ineligible = eligibility.NONE,
    ) -> None:
        self.raw, self.groups, self.request, self.demand, self.kept = state, groups, request, demand, kept
        self.ineligible = ineligible
        self.candidates = sorted(candidates, key=lambda g: (g.priority, g.key))
        self._states: dict[frozenset[GroupKey], snapshots.NodeState] = {}
        self._tried = 0
        self._narrow: dict[tuple[str, str], tuple[snapshots.NodeState, list[BoundGroup]]] = {}
        self._holders: dict[tuple[str, str], list[GroupKey]] = {}
        for group in groups:
            for resource, ids in group.allocation.devices.items():
                for device in ids:
                    self._holders.setdefault((resource, device), []).append(group.key)

    def state(self, removed: frozenset[GroupKey]) -> snapshots.NodeState:
        found = self._states.get(removed)
        if found is None:
            found = self._states[removed] = self.ineligible.narrow(
                nominations.withhold(without(self.raw, self.groups, removed), self.kept))
        return found

    def fits(self, removed: frozenset[GroupKey]) -> bool:
        return placement.fits(self.state(removed), self.request, self.demand)

    def failure(self) -> str | None:
        """Why the preemptor does not fit even with every candidate gone; None when it does."""
        return placement.node_failure(self.state(frozenset(c.key for c in self.candidates)), self.request, self.demand)

    def best(self) -> Choice | None:
        """The cheapest sufficient victim set, or None when evicting every candidate is not enough."""
        if self.fits(frozenset()):
            return Choice((), self.state(frozenset()))
        priorities = sorted({c.priority for c in self.candidates})
        below = [frozenset(c.key for c in self.candidates if c.priority <= p) for p in priorities]
        if not below or not self.fits(below[-1]):
            return None
        lo, hi = 0, len(below) - 1  # the lowest highest-victim priority: fitting is monotone in it
        while lo < hi:
            mid = (lo + hi) // 2
            if self.fits(below[mid]):
                hi = mid
            else:
                lo = mid + 1
        eligible = [c for c in self.candidates if c.key in below[lo]]
        chosen = self._fewest(eligible)
        if chosen is None or not self.fits(chosen):
            chosen = self._reprieve(eligible)
        by_key = {c.key: c for c in eligible}
        return Choice(tuple(by_key[k] for k in sorted(chosen)), self.state(chosen))

    def _reprieve(self, eligible: Sequence[BoundGroup]) -> frozenset[GroupKey]:
        """kube-scheduler's pass: all evicted, then the most important taken back while it still fits."""
        removed = {c.key for c in eligible}
        for group in sorted(eligible, key=lambda g: (-g.priority, g.key)):
            if self.fits(frozenset(removed - {group.key})):
                removed.discard(group.key)
        return frozenset(removed)

    def _device_state(self, resource: str, device: str, removed: frozenset[GroupKey]) -> snapshots.NodeState:
        """The node narrowed to one device, without ``removed``: the same rules, a fraction of the work."""
        key = (resource, device)
        narrow = self._narrow.get(key)
        if narrow is None:
            holders = set(self._holders.get(key, ()))
            info = dataclasses.replace(self.raw.info, devices={resource: (device,)})
            narrow = self._narrow[key] = (
                snapshots.NodeState(info, {}, self.raw.cpu_used, self.raw.memory_used),
                [g for g in self.groups if g.key in holders],
            )
        return nominations.withhold(without(narrow[0], narrow[1], removed), self.kept)

    def _usable(self, resource: str, device: str, share: capacity.Share | None, removed: frozenset[GroupKey]) -> bool:
        state = self._device_state(resource, device, removed)
        if device in state.free.get(resource, ()):
            if share is None:
                return True
            info = state.info
            fresh = capacity.fresh(
                device, info.device_memory.get(resource), info.device_tiles.get(resource, 0), share.kind
            )
            return capacity.fits(fresh, share)
        return share is not None and any(
            left.device == device and capacity.fits(left, share) for left in state.partial.get(resource, ())
        )

    def _unlocks(
        self, resource: str, device: str, share: capacity.Share | None, eligible: frozenset[GroupKey]
    ) -> list[frozenset[GroupKey]]:
        """The minimal sets of eligible groups whose leaving makes ``device`` usable for the preemptor."""
        if self._usable(resource, device, share, frozenset()):
            return [frozenset()]
        holders = sorted(set(self._holders.get((resource, device), ())))
        removable = [h for h in holders if h in eligible]
        if share is None or len(removable) > MAX_SHARERS_SEARCHED:
            every = frozenset(removable)
            return [every] if removable and self._usable(resource, device, share, every) else []
        found: list[frozenset[GroupKey]] = []
        for size in range(1, len(removable) + 1):
            for subset in itertools.combinations(removable, size):
                chosen = frozenset(subset)
                if any(f <= chosen for f in found):
                    continue
                self._tried += 1
                if self._usable(resource, device, share, chosen):
                    found.append(chosen)
        return found

    def _fewest(self, eligible: Sequence[BoundGroup]) -> frozenset[GroupKey] | None:
        """Among ``eligible`` (all of one highest priority or below), the fewest groups, then pods, then names."""
        keys = frozenset(c.key for c in eligible)
        unions: list[frozenset[GroupKey]] = [frozenset()]
        for resource in sorted(self.request.resources):
            count, share = self.request.resources[resource], self.request.share.get(resource)
            skipped = self.ineligible.on(self.raw.info.name) if resource == self.ineligible.resource else frozenset()
            ids = [d for d in self.raw.info.devices.get(resource, ()) if d not in skipped]
            per_device = [opts for d in ids if (opts := self._unlocks(resource, d, share, keys))]
            if sum(1 for opts in per_device if frozenset() in opts) >= count:
                continue  # enough usable already
            mine: set[frozenset[GroupKey]] = set()
            for chosen in itertools.combinations(per_device, count):
                for picks in itertools.product(*chosen):
                    self._tried += 1
                    if self._tried > SEARCH_BUDGET:
                        return None
                    mine.add(frozenset(k for pick in picks for k in pick))
            unions = list({u | m for u in unions for m in mine})
            if not unions:
                return None
        by_key = {c.key: c for c in eligible}
        base = self.state(frozenset())
        best: tuple[int, int, tuple[GroupKey, ...]] | None = None
        for union in sorted(unions, key=len):
            if best is not None and len(union) > best[0]:
                break
            cpu_short = self.demand.cpu_milli - (base.info.cpu_milli - base.cpu_used) - sum(
                by_key[k].cpu_milli for k in union)
            memory_short = self.demand.memory_bytes - (base.info.memory_bytes - base.memory_used) - sum(
                by_key[k].memory_bytes for k in union)
            rest = [c for c in eligible if c.key not in union]
            for extra in _top_ups(rest, cpu_short, memory_short, None if best is None else best[0] - len(union)):
                self._tried += 1
                if self._tried > SEARCH_BUDGET:
                    return None
                names = tuple(sorted(union | {c.key for c in extra}))
                rank = (len(names), sum(by_key[k].pods for k in names), names)
                if best is None or rank < best:
                    best = rank
        return None if best is None else frozenset(best[2])


def _top_ups(
    pool: Sequence[BoundGroup], cpu_short: int, memory_short: int, most: int | None
) -> Iterable[tuple[BoundGroup, ...]]:
    """The smallest sets of ``pool`` freeing the CPU and memory still short (nothing when nothing is)."""
    if cpu_short <= 0 and memory_short <= 0:
        yield ()
        return
    limit = len(pool) if most is None else min(most, len(pool))
    for size in range(1, limit + 1):
        found = False
        for extra in itertools.combinations(pool, size):
            if sum(g.cpu_milli for g in extra) >= cpu_short and sum(g.memory_bytes for g in extra) >= memory_short:
                found = True
                yield extra
        if found:
            return

