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


def restrict(
    snapshot: snapshots.LedgerSnapshot, resource: str, excluded: Mapping[str, Set[str]]
) -> snapshots.LedgerSnapshot:
    """``snapshot`` without the ``excluded`` devices (node -> device IDs the claim's selectors do not match) of
    ``resource`` on offer. Only the shards of those nodes are copied: a selector most devices match costs little."""
    touched = {node: devices for node, devices in excluded.items() if devices and node in snapshot.nodes}
    if not touched:
        return snapshot
    shards = list(snapshot.nodes.shards)
    for node, devices in touched.items():
        i = hash(node) % snapshots.SHARDS
        if shards[i] is snapshot.nodes.shards[i]:
            shards[i] = dict(shards[i])
        shards[i][node] = narrow(shards[i][node], resource, devices)
    return snapshots.LedgerSnapshot(
        revision=snapshot.revision,
        nodes=snapshots.NodeStates(tuple(shards)),
        index=snapshot.index,
        parts=snapshot.parts,
        linked_nodes=snapshot.linked_nodes,
        filter_classes=None,  # its classes count the ledger's free devices, not the narrowed ones
    )
