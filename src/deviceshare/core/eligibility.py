"""A snapshot as one group sees it when only some devices of a resource may be its: a DRA group's claim selectors
(CONTRACT §13) narrow the devices of its DeviceClass to those they match.

The operator evaluates the selectors (``operator/drainventory.py``) and hands over the device IDs they allow;
here every node's free and partly used devices of that resource are narrowed to them, as
:func:`deviceshare.core.nominations.overlay` withholds a nomination's. The free-capacity index is the ledger's, so
its counts are upper bounds: the placement walk still filters each node on its narrowed state, and a node with
too few allowed devices fails with the same reason as one with too few free devices.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Set

from deviceshare.core import snapshots


def narrow(state: snapshots.NodeState, resource: str, allowed: Set[str]) -> snapshots.NodeState:
    """The node with only the ``allowed`` devices of ``resource`` offered."""
    free = state.free.get(resource)
    partial = state.partial.get(resource)
    if not free and not partial:
        return state
    new_free = dict(state.free)
    new_free[resource] = tuple(d for d in free or () if d in allowed)
    new_partial = dict(state.partial)
    if partial:
        kept = tuple(left for left in partial if left.device in allowed)
        if kept:
            new_partial[resource] = kept
        else:
            del new_partial[resource]
    return dataclasses.replace(state, free=new_free, partial=new_partial)


def restrict(snapshot: snapshots.LedgerSnapshot, resource: str, allowed: Set[str]) -> snapshots.LedgerSnapshot:
    """``snapshot`` with only the ``allowed`` devices of ``resource`` offered anywhere."""
    shards = tuple(
        {name: narrow(state, resource, allowed) if resource in state.info.devices else state
         for name, state in shard.items()}
        for shard in snapshot.nodes.shards
    )
    return snapshots.LedgerSnapshot(
        revision=snapshot.revision,
        nodes=snapshots.NodeStates(shards),
        index=snapshot.index,
        parts=snapshot.parts,
        linked_nodes=snapshot.linked_nodes,
        filter_classes=None,  # its classes count the ledger's free devices, not the narrowed ones
    )
