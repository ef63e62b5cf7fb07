"""What one scheduling cycle changes in what the operator knows, collected as it goes and made so in one step.

The phases of a cycle (``scheduler.py``, ``placing.py``) decide and write to the API; what follows from those
writes for the operator's own records is noted here, never done on the spot:

- ``seen``: the API's answer to a read or write of a group (kept unless a newer event got here first);
- ``placed``: the claim landed in the group's status: the ledger commits the reservation, the group no longer
  waits, its nomination (a preemption's) is done; ``released``: the claim is certainly not in the API (a write
  refused, a placement rolled back): the ledger gives the devices back;
- ``waits``: why the group could not be placed (what its status says until it is);
- ``binding``: a Binding about to be sent, the pod counted as our member from then on (written ahead, so a
  Binding that lands unseen never leaves its devices without a member); ``bound``: it landed: the pod is assumed
  on its node, its CPU and memory accounted, its ``Scheduled`` event queued; ``not_bound``: it certainly did not
  land, the member record is undone;
- ``gone``: the group was deleted under the cycle.

:meth:`CycleChanges.apply` makes all of it so, with no await in between: the ledger's and the queue's books, then
:meth:`~.state.ClusterState.apply` (the one place ``state.py`` is entered to change anything during a cycle),
then the events. The scheduler applies when its bind phase starts (the claim and every binding about to be sent
recorded before the first is), before a post-filter (which reads the group as the API last answered), and when
the cycle ends, whatever way it ends (a failure's undoing included).
"""

from __future__ import annotations

from collections.abc import Mapping

from deviceshare.api import names
from deviceshare.core import ledger as ledgers

from . import state as state_
from . import statuses
from .context import Context


class CycleChanges:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._state = state_.Changes()
        self._committed: list[state_.GroupKey] = []
        self._released: list[state_.GroupKey] = []
        self._waits: dict[state_.GroupKey, str | None] = {}  # None: it no longer waits
        self._bound: list[tuple[state_.PodRecord, ledgers.Allocation, str]] = []

    def seen(self, group: state_.GroupRecord) -> state_.GroupRecord:
        """Keep the API's answer about ``group``; handed back, for the caller acts on what the API said."""
        self._state.seen.append(group)
        return group

    def gone(self, key: state_.GroupKey) -> None:
        self._state.gone.append(key)

    def placed(self, key: state_.GroupKey) -> None:
        self._committed.append(key)
        self._waits[key] = None

    def released(self, key: state_.GroupKey) -> None:
        self._released.append(key)

    def waits(self, key: state_.GroupKey, why: str) -> None:
        self._waits[key] = why

    def binding(self, pod: state_.PodRecord, group: str) -> None:
        self._state.ahead.append((pod.key, pod.uid, group))

    def bound(
        self, pod: state_.PodRecord, group: str, allocation: ledgers.Allocation, annotations: Mapping[str, str]
    ) -> None:
        self._state.bound.append((pod, allocation.node, annotations, group))
        self._bound.append((pod, allocation, group))

    def not_bound(self, pod: state_.PodRecord) -> None:
        self._state.forgotten.append((pod.key, pod.uid))

    def apply(self) -> None:
        """Make every change noted since the last call so, in one step (nothing awaited)."""
        ctx = self.ctx
        for key in self._committed:
            ctx.ledger.commit(key)
        for key in self._released:
            ctx.ledger.release(key)
        for key, why in self._waits.items():
            if why is not None:
                ctx.unschedulable[key] = why
                continue
            ctx.unschedulable.pop(key, None)
            ctx.nominations = ctx.nominations.clear(key)
        changed = self._state
        if changed.seen or changed.gone or changed.ahead or changed.bound or changed.forgotten:
            ctx.state.apply(changed)
        for pod, allocation, group in self._bound:
            ctx.ledger.account_pod(pod.key, allocation.node, pod.demand.cpu_milli, pod.demand.memory_bytes)
            ctx.event(
                pod, "Scheduled",
                f"Successfully assigned {names.key_text(pod.key)} to {allocation.node} with "
                f'{statuses.describe_allocation(allocation)} (SharedDeviceGroup "{group}")',
            )
        self._committed, self._released, self._waits, self._bound = [], [], {}, []
