"""Placements whose status write ended uncertain: resolved by reading the group back, before anything else is
decided about the group.

A placement persists its claim in the group's status, conditional on the resourceVersion it was computed from.
When that write's answer is lost and cannot be read back at once (``storage.Uncertain``), the claim may be in the
API or not. The ledger then keeps the reservation (in flight: no member joins, nobody else gets the devices),
and the group is *unsettled*. The next time the scheduler or the reconciler holds the group's lock, it reads the
group back first (:meth:`Unsettled.settle`):

- the status shows the claim: it landed; the reservation is committed;
- the group is still at the version the write was conditional on: it has not landed, and only that version can
  take it: the same write is sent again;
- the group moved on without the claim, or is gone: the write can never land any more; only now are the devices
  released.

A rebuild (a new term) starts with none: the API's picture then is what the ledger is built from.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from deviceshare.api import names
from deviceshare.core import ledger as ledgers

from . import state as state_
from . import storage

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Pending:
    """An uncertain claim: the status ``written``, conditional on ``precondition``'s resourceVersion."""

    precondition: state_.GroupRecord
    written: Mapping[str, Any]


def shows(group: state_.GroupRecord, allocation: ledgers.Allocation) -> bool:
    """Whether the group's status claims exactly ``allocation`` (node, devices, tiles)."""
    status = group.status
    return (
        status.phase == names.PHASE_BOUND
        and status.node_name == allocation.node
        and {r: list(ids) for r, ids in (status.allocated_devices or {}).items()}
        == {r: list(ids) for r, ids in allocation.devices.items()}
        and {r: list(ids) for r, ids in (status.allocated_tiles or {}).items()}
        == {r: list(ids) for r, ids in allocation.tiles.items() if ids}
    )


class Unsettled:
    """The groups whose claim is neither known to be in the API nor known not to be."""

    def __init__(self) -> None:
        self._pending: dict[state_.GroupKey, Pending] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._pending

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, precondition: state_.GroupRecord, written: Mapping[str, Any]) -> None:
        self._pending[precondition.key] = Pending(precondition, dict(written))

    def clear(self) -> None:
        self._pending.clear()

    async def settle(
        self, api: storage.ClusterApi, ledger: ledgers.DeviceLedger, cluster: state_.ClusterState,
        key: state_.GroupKey,
    ) -> bool:
        """Resolve ``key``'s claim if it is unsettled (call under the group's lock). True once it is settled
        (or was not unsettled); raises ``RetryLater`` (``Uncertain`` included) while it still cannot tell."""
        pending = self._pending.get(key)
        if pending is None:
            return True
        allocation = ledger.allocation(key)
        if allocation is None:  # released meanwhile by someone who knew better (cannot happen under the lock)
            del self._pending[key]
            return True
        current = await api.read_group_if_exists(key)
        if current is not None and current.uid == pending.precondition.uid:
            cluster.keep(current)
            if shows(current, allocation):
                logger.info("group %s/%s: the uncertain claim landed", *key)
                self._landed(ledger, key)
                return True
            if current.resource_version == pending.precondition.resource_version:
                written = await api.patch_group_status(
                    key, pending.written, uid=current.uid, resource_version=current.resource_version
                )
                cluster.keep(written)
                self._landed(ledger, key)
                return True
        # Gone, or moved on without our claim: a write conditional on the old version can never land now.
        logger.info("group %s/%s: the uncertain claim did not land; its devices are released", *key)
        del self._pending[key]
        ledger.release(key)
        return True

    def _landed(self, ledger: ledgers.DeviceLedger, key: state_.GroupKey) -> None:
        del self._pending[key]
        ledger.commit(key)
