"""The cluster's fragmentation per device resource, kept current from the ledger's node changes.

An on-call engineer asks "how fragmented are the GPUs?". The answer here is FGD's measure as the paper
defines it (:mod:`fragmentation`; ``schedulingStrategy: fgd`` decides with our variant, :mod:`fgd`), summed
over the open nodes (shared, Ready, schedulable, with a sound inventory) and divided by their idle capacity:
the share of idle device compute that the expected workload could not use, 0..1 (the FGD paper's
*fragmentation rate*). A node's state is FGD's signature on that resource (per-device free compute
milli, the node's free CPU); the expected workload is the operator's learned mix
(:mod:`workloadmix`), restricted to the shapes that ask for the resource and renormalised, so a
cluster with two kinds of device reports each against its own groups.

Why incremental: a scrape must not walk the cluster, and a placement must not pay for the gauge.
:meth:`FleetFragmentation.node_changed` is fed by :meth:`ledger.DeviceLedger.subscribe` and only notes
the node's new state (O(1) on the scheduling path). Reading (:meth:`FleetFragmentation.rates`) turns
the nodes changed since the last read into signatures, keeps how many nodes are in each signature and
the idle sum, and prices only the signatures whose counts changed; when the workload itself changed it
prices every live signature once (distinct node states, not nodes). A read costs at most the nodes that
changed. :func:`recompute` is the full scan the incremental value must always equal (tested at random).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from deviceshare.core import fgdgroups, snapshots
from deviceshare.core import fragmentation as frag

Workload = tuple[frag.WeightedShape, ...]
_Entry = tuple[str, frag.Signature]  # (resource, the node's signature on it)


def is_open(state: snapshots.NodeState) -> bool:
    """A node new groups may go to (the ledger's free-capacity index files the same nodes)."""
    info = state.info
    return info.shared and info.ready and not info.unschedulable and not info.problems


def entries(state: snapshots.NodeState | None) -> tuple[_Entry, ...]:
    """The node's signature per device resource; none for a node that takes no new group."""
    if state is None or not is_open(state):
        return ()
    cpu_free = state.info.cpu_milli - state.cpu_used
    return tuple(
        (resource, frag.signature_of(resource, cpu_free, fgdgroups.free_values(state, resource).values()))
        for resource, ids in sorted(state.info.devices.items())
        if ids
    )


def measure_for(resource: str, workload: Sequence[frag.WeightedShape]) -> frag.Fragmentation:
    """FGD's measure against the shapes that may use ``resource``, weights renormalised to sum 1."""
    mine = [w for w in workload if w.shape.gpu_milli > 0 and w.shape.allows(resource)]
    total = sum(w.weight for w in mine)
    return frag.Fragmentation(
        tuple(frag.WeightedShape(w.shape, w.weight / total) for w in mine) if total > 0 else (), memo=False
    )


def rate(fragment: float, idle_milli: int) -> float:
    """Fragmented over idle capacity, within 0..1 (rounded weights may overshoot a hair)."""
    return min(1.0, max(0.0, fragment / idle_milli)) if idle_milli > 0 else 0.0


def recompute(states: Iterable[snapshots.NodeState], workload: Workload) -> dict[str, float]:
    """The rates from scratch: every open node priced once (the reference for the incremental path)."""
    fragment: dict[str, float] = {}
    idle: dict[str, int] = {}
    measures: dict[str, frag.Fragmentation] = {}
    for state in states:
        for resource, sig in entries(state):
            measure = measures.get(resource)
            if measure is None:
                measure = measures[resource] = measure_for(resource, workload)
            fragment[resource] = fragment.get(resource, 0.0) + measure.compute(sig)
            idle[resource] = idle.get(resource, 0) + sum(sig[2])
    return {resource: rate(fragment[resource], idle[resource]) for resource in sorted(idle)}


class FleetFragmentation:
    """Per resource: nodes per signature, idle milli, and the fragment sum under the last workload read."""

    def __init__(self) -> None:
        self._changed: dict[str, snapshots.NodeState | None] = {}  # the nodes' latest states, not yet counted
        self._nodes: dict[str, tuple[_Entry, ...]] = {}
        self._counts: dict[str, dict[frag.Signature, int]] = {}  # resource -> signature -> open nodes in it
        self._idle: dict[str, int] = {}  # resource -> idle compute milli over the open nodes
        self._fragment: dict[str, float] = {}  # resource -> sum of fragments, as of the last read
        self._pending: dict[_Entry, int] = {}  # count changes not yet priced into _fragment
        self._prices: dict[_Entry, float] = {}  # the fragment of each signature priced (live ones only)
        self._measures: dict[str, frag.Fragmentation] = {}
        self._workload: Workload | None = None

    def node_changed(self, name: str, state: snapshots.NodeState | None) -> None:
        """The ledger's word that ``name`` now is ``state`` (None: the node is gone); counted at the next read."""
        self._changed[name] = state

    def _take_changes(self) -> None:
        changed, self._changed = self._changed, {}
        for name, state in changed.items():
            new = entries(state)
            old = self._nodes.get(name, ())
            if new == old:
                continue
            if new:
                self._nodes[name] = new
            else:
                self._nodes.pop(name, None)
            for entry in old:
                self._count(entry, -1)
            for entry in new:
                self._count(entry, +1)

    def _count(self, entry: _Entry, delta: int) -> None:
        resource, sig = entry
        counts = self._counts.setdefault(resource, {})
        left = counts.get(sig, 0) + delta
        if left:
            counts[sig] = left
        else:
            del counts[sig]
        self._idle[resource] = self._idle.get(resource, 0) + delta * sum(sig[2])
        pending = self._pending.get(entry, 0) + delta
        if pending:
            self._pending[entry] = pending
        else:
            del self._pending[entry]

    def rates(self, workload: Workload) -> dict[str, float]:
        """resource -> fragmentation rate (0..1) of the open nodes having that resource, against ``workload``."""
        self._take_changes()
        if workload != self._workload:
            self._reprice(workload)
        else:
            self._settle()
        return {r: rate(self._fragment.get(r, 0.0), self._idle[r]) for r in sorted(self._counts) if self._counts[r]}

    def _price(self, entry: _Entry) -> float:
        got = self._prices.get(entry)
        if got is None:
            resource, sig = entry
            measure = self._measures.get(resource)
            if measure is None:
                measure = self._measures[resource] = measure_for(resource, self._workload or ())
            got = self._prices[entry] = measure.compute(sig)
        return got

    def _settle(self) -> None:
        """Price the count changes since the last read (a signature left by every node drops its price)."""
        pending, self._pending = self._pending, {}
        for entry, delta in pending.items():
            resource, sig = entry
            self._fragment[resource] = self._fragment.get(resource, 0.0) + delta * self._price(entry)
            if sig not in self._counts.get(resource, {}):
                del self._prices[entry]

    def _reprice(self, workload: Workload) -> None:
        """A new workload: every live signature priced again under it (summed exactly, no drift kept)."""
        self._workload = workload
        self._measures.clear()
        self._prices.clear()
        self._pending.clear()
        self._fragment = {
            resource: sum(count * self._price((resource, sig)) for sig, count in counts.items())
            for resource, counts in self._counts.items()
        }
