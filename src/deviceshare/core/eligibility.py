"""A snapshot as one group sees it when only some devices of a resource may be its: a DRA group's claim selectors
(CONTRACT §13) narrow the devices of its DeviceClass to those they match.

The operator evaluates the selectors (``operator/drainventory.py``) and hands over, per node, the device IDs they
do not match; here those nodes' free and partly used devices of that resource are narrowed, as
:func:`deviceshare.core.nominations.overlay` withholds a nomination's. The free-capacity index is the ledger's, so
its counts are upper bounds: the placement walk still filters each node on its narrowed state, and a node with
too few allowed devices fails with the same reason as one with too few free devices.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Set

from deviceshare.core import snapshots


def narrow(state: snapshots.NodeState, resource: str, excluded: Set[str]) -> snapshots.NodeState:
    """The node without the ``excluded`` devices of ``resource`` on offer."""
    free = state.free.get(resource)
    partial = state.partial.get(resource)
    if not excluded or (not free and not partial):
        return state
    new_free = dict(state.free)
    new_free[resource] = tuple(d for d in free or () if d not in excluded)
    new_partial = dict(state.partial)
    if partial:
        kept = tuple(left for left in partial if left.device not in excluded)
        if kept:
            new_partial[resource] = kept
        else:
            del new_partial[resource]
    return dataclasses.replace(state, free=new_free, partial=new_partial)


@dataclasses.dataclass(frozen=True, slots=True)
class Ineligible:
    """The devices of ``resource`` a group may not take, per node (node -> device IDs; nodes where it may take them
    all are absent): those its DRA claim's selectors do not match, free or held. Preemption reads it to count only
    the devices a victim's eviction frees *for this preemptor* (:func:`deviceshare.core.preemption.decide`)."""

    resource: str
    by_node: Mapping[str, Set[str]]

    def on(self, node: str) -> Set[str]:
        return self.by_node.get(node, frozenset())

    def narrow(self, state: snapshots.NodeState) -> snapshots.NodeState:
        """``state`` without the ineligible devices on offer (:func:`narrow`)."""
        return narrow(state, self.resource, self.on(state.info.name))


NONE = Ineligible("", {})  # a group that may take any device of its resources


Narrowed = dict[str, tuple[snapshots.NodeState, snapshots.NodeState]]  # node -> (ledger's state, narrowed)


def restrict(
    snapshot: snapshots.LedgerSnapshot, resource: str, excluded: Mapping[str, Set[str]],
    memo: Narrowed | None = None,
) -> snapshots.LedgerSnapshot:
    """``snapshot`` without the ``excluded`` devices (node -> device IDs the claim's selectors do not match) of
    ``resource`` on offer. Only the shards of those nodes are copied: a selector most devices match costs little.
    ``memo`` (the caller's, one per ``excluded``) keeps each node's narrowed state while the ledger's state of it
    is the same object (snapshots share the states of nodes that did not change): a selector few devices match
    narrows only the nodes that changed since the last decision."""
    nodes = snapshot.nodes
    shards = list(nodes.shards)
    copied = [False] * len(shards)
    for node, devices in excluded.items():
        i = hash(node) % snapshots.SHARDS
        state = shards[i].get(node)
        if state is None or not devices:
            continue
        kept = memo.get(node) if memo is not None else None
        if kept is not None and kept[0] is state:
            narrowed = kept[1]
        else:
            narrowed = narrow(state, resource, devices)
            if memo is not None:
                memo[node] = (state, narrowed)
        if narrowed is state:
            continue
        if not copied[i]:
            shards[i], copied[i] = dict(shards[i]), True
        shards[i][node] = narrowed
    if not any(copied):
        return snapshot
    return snapshots.LedgerSnapshot(
        revision=snapshot.revision,
        nodes=snapshots.NodeStates(tuple(shards)),
        index=snapshot.index,
        parts=snapshot.parts,
        linked_nodes=snapshot.linked_nodes,
        filter_classes=None,  # its classes count the ledger's free devices, not the narrowed ones
    )
