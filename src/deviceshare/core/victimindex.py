"""Nodes in the order of the cheapest victim set they could offer a preemptor: preemption without a scan.

:func:`preemption.decide` bounds each node's rank from below (:func:`preemptionbounds.bound`: what the node
could free at best, read from :class:`victims.NodeGroups`' running totals) and searches nodes exactly
in the order of that bound. Scanning 5,000 nodes for the bounds was nearly all of a decision. The bound
for a request of ``count`` devices of one resource, taken over *every* group on the node (not only
those below the preemptor's priority), with the node's usable devices counted at most (every free
device, every partly used device with any room left in the share's dimension), and before CPU, memory,
nominations and protected groups, is never above the bound the scan computes (more candidates, more
usable devices and fewer needs can only lower it), and it depends on the node alone. So it is kept
here per (resource, how a request takes it, count), sorted; the node filed again when its state
(followed through the ledger's snapshots by shard identity, as :mod:`fgdindex` does) or its groups
(:meth:`VictimIndex.file`) change. A decision walks the order and searches exactly while a node's key
could still beat the best found: the answer is the scan's (tests/core/test_preemption_properties.py).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator, Mapping, ValuesView
from typing import Any

from deviceshare.core import capacity, snapshots, victims

WHOLE = "whole"  # whole devices; a share is taken by its dimension (snapshots.COMPUTE, MEMORY, TILES)
Bound = tuple[int, int, int, int]
Mode = tuple[str, str]  # (resource, WHOLE or a share's dimension)
FITS = (0, 0, 0, 0)


def mode_of(share: capacity.Share | None) -> str:
    return WHOLE if share is None else snapshots.dimension(share)


def usable_at_most(state: snapshots.NodeState, resource: str, how: str) -> int:
    """An upper bound of the node's devices a request taking ``resource`` ``how`` could use right now."""
    free = len(state.free.get(resource, ()))
    if how == WHOLE:
        return free
    partial = state.partial.get(resource, ())
    if how == snapshots.TILES:
        return free + sum(1 for left in partial if left.kind is capacity.Kind.TILES and left.free_tiles)
    if how == snapshots.COMPUTE:
        return free + sum(1 for left in partial if left.kind is capacity.Kind.SHARED and left.compute_milli > 0)
    return free + sum(1 for left in partial if left.kind is capacity.Kind.SHARED and (left.memory_bytes or 0) > 0)


def keys(state: snapshots.NodeState, groups: victims.NodeGroups, mode: Mode) -> dict[int, Bound]:
    """count -> the node's key for a request of that many devices (counts it can never give left out)."""
    resource, how = mode
    devices = len(state.info.devices.get(resource, ()))
    usable = usable_at_most(state, resource, how)
    n = len(groups.groups)
    sums = groups.touches.get(resource)
    out: dict[int, Bound] = {}
    for count in range(1, devices + 1):
        lacking = count - usable
        if lacking <= 0:
            out[count] = FITS
            continue
        if sums is None or sums[n] < lacking:
            break  # not even evicting every group frees enough, nor for more devices
        enough = bisect.bisect_left(sums, lacking)
        fewest = -(-lacking // groups.most_touched[resource][n])
        out[count] = (1, groups.priorities[enough - 1], fewest, fewest * groups.fewest_pods[n])
    return out


class VictimIndex(Mapping[str, victims.NodeGroups]):
    """The groups bound on each node (what :func:`preemption.decide` reads) with the nodes' orders by key."""

    def __init__(self, groups: Mapping[str, victims.NodeGroups] | None = None) -> None:
        self._lock = threading.Lock()
        self._groups: dict[str, victims.NodeGroups] = dict(groups or {})
        self._follower = snapshots.Follower()
        self._orders: dict[Mode, dict[int, list[tuple[Bound, str]]]] = {}  # kept for the modes asked for
        self._filed: dict[Mode, dict[str, dict[int, Bound]]] = {}

    def __getitem__(self, name: str) -> victims.NodeGroups:
        return self._groups[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._groups)

    def __len__(self) -> int:
        return len(self._groups)

    def get(self, name: str, default: Any = None) -> Any:  # a dict's speed: decide asks it for every node bounded
        return self._groups.get(name, default)

    def values(self) -> ValuesView[victims.NodeGroups]:
        return self._groups.values()

    def file(self, name: str, groups: victims.NodeGroups) -> None:
        """The groups bound on node ``name`` now (:data:`victims.EMPTY` when none)."""
        with self._lock:
            if groups.groups:
                self._groups[name] = groups
            else:
                self._groups.pop(name, None)
            state = self._follower.states.get(name)
            if state is not None:
                self._refile(name, state)

    def order(self, snapshot: snapshots.LedgerSnapshot, resource: str, how: str, count: int) -> list[tuple[Bound, str]]:
        """(key, node) of the nodes that could give ``count`` devices of ``resource`` taken ``how``, sorted."""
        mode = (resource, how)
        with self._lock:
            self._catch_up(snapshot)
            orders = self._orders.get(mode)
            if orders is None:
                orders = self._orders[mode] = {}
                filed = self._filed[mode] = {}
                for name, state in self._follower.states.items():
                    filed[name] = found = keys(state, self._groups.get(name, victims.EMPTY), mode)
                    for c, key in found.items():
                        orders.setdefault(c, []).append((key, name))
                for entries in orders.values():
                    entries.sort()
            return list(orders.get(count, ()))

    def _catch_up(self, snapshot: snapshots.LedgerSnapshot) -> None:
        for name, state in self._follower.changes(snapshot):
            self._refile(name, state)

    def _refile(self, name: str, state: snapshots.NodeState | None) -> None:
        groups = self._groups.get(name, victims.EMPTY)
        for mode, orders in self._orders.items():
            filed = self._filed[mode]
            before = filed.pop(name, {})
            after = keys(state, groups, mode) if state is not None else {}
            for count, key in before.items():
                if after.get(count) != key:
                    entries = orders[count]
                    del entries[bisect.bisect_left(entries, (key, name))]
            for count, key in after.items():
                if before.get(count) != key:
                    bisect.insort(orders.setdefault(count, []), (key, name))
            if after:
                filed[name] = after
