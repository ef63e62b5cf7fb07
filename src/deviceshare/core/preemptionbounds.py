"""A lower bound of the rank a node could reach for a preemptor: what it could free at best (preemption, per node).

:func:`preemption.decide` searches nodes exactly (:mod:`victims`) in the order of this bound and stops once no node
left can beat the best found, so the bound must never be above the rank the exact search finds: every device a
candidate holds counts as freed (a device becomes usable only when one of its holders leaves), and the largest
candidate for how few could free it. Run once per node per decision: written for speed, no intermediate
collections.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Sequence

from deviceshare.core import capacity, inventory, reasons, snapshots, victims

NO_VICTIMS = "No preemption victims found for incoming pod"  # no group of lower priority on the node


class Need:
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


def bound(
    state: snapshots.NodeState,
    indexed: bool,
    needs: Sequence[Need],
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
        return FITS_NOW
    return (1, groups.priorities[enough - 1], fewest, fewest * groups.fewest_pods[m])


FITS_NOW = (0, 0, 0, 0)
