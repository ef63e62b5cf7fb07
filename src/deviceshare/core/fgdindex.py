"""Open nodes grouped by FGD signature, kept current from ledger snapshots at the cost of what changed.

FGD rates a node by its state only (per-device free compute, free CPU), and most nodes of a
cluster share a state with many others, so the ``fgd`` strategy rates *classes* of nodes, never the
whole cluster. The classes are kept here across decisions: a snapshot's node states live in
shards that the ledger copies before it writes (:class:`snapshots.NodeStates`), so a shard object
seen before is unchanged, and only the nodes of new shards are compared (by identity) and moved.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Callable, Mapping

from deviceshare.core import fgd, snapshots
from deviceshare.core import ledger as ledgers
from deviceshare.core.fragmentation import MILLI, Signature

SignatureOf = Callable[[ledgers.NodeState], Signature]


def is_open(state: ledgers.NodeState) -> bool:
    """As the ledger files nodes in its indexes: shared, Ready, not cordoned, valid inventory."""
    info = state.info
    return info.shared and info.ready and not info.unschedulable and not info.problems


class SignatureClasses:
    """For one device resource: signature -> names of the open nodes in that state, sorted."""

    def __init__(self, resource: str, signature_of: SignatureOf) -> None:
        self.resource = resource
        self._signature_of = signature_of
        self._follower = snapshots.Follower()
        self._ids: dict[Signature, int] = {}  # a signature keeps its id for the index's life
        self.signatures: list[Signature] = []  # class id -> signature
        self._class: dict[str, int] = {}
        self._members: dict[int, list[str]] = {}
        self._sizes: dict[str, tuple[int, int]] = {}  # open node -> (devices, CPU milli)
        self._by_size: collections.Counter[tuple[int, int]] = collections.Counter()

    @property
    def classes(self) -> Mapping[int, list[str]]:
        """Class id -> names of its open nodes, sorted; classes without nodes are left out."""
        return self._members

    def class_of(self, name: str) -> int:
        return self._class[name]

    @property
    def devices(self) -> int:
        """The most devices of the resource on one open node (0 without any)."""
        return max((devices for devices, _ in self._by_size), default=0)

    def node_types(self) -> tuple[tuple[fgd.NodeType, tuple[int, int]], ...]:
        """The open nodes' types (this resource, device count) with their devices' milli and most CPU, sorted."""
        types: dict[fgd.NodeType, tuple[int, int]] = {}
        for (devices, cpu), count in self._by_size.items():
            if devices:
                milli, most = types.get((self.resource, devices), (0, 0))
                types[(self.resource, devices)] = (milli + count * devices * MILLI, max(most, cpu))
        return tuple(sorted(types.items()))

    def update(self, snapshot: ledgers.LedgerSnapshot) -> None:
        """Catch up with ``snapshot``: only shards the ledger replaced since the last call are read."""
        for name, state in self._follower.changes(snapshot):
            self._file(name, state)

    def _file(self, name: str, state: ledgers.NodeState | None) -> None:
        previous = self._class.pop(name, None)
        if previous is not None:
            members = self._members[previous]
            del members[bisect.bisect_left(members, name)]
            if not members:
                del self._members[previous]
            size = self._sizes.pop(name)
            self._by_size[size] -= 1
            if not self._by_size[size]:
                del self._by_size[size]
        if state is None:
            return
        if not is_open(state) or not state.info.devices.get(self.resource):
            return
        sig = self._signature_of(state)
        cid = self._ids.get(sig)
        if cid is None:
            cid = self._ids[sig] = len(self.signatures)
            self.signatures.append(sig)
        self._class[name] = cid
        bisect.insort(self._members.setdefault(cid, []), name)
        size = self._sizes[name] = (len(state.info.devices[self.resource]), state.info.cpu_milli)
        self._by_size[size] += 1
