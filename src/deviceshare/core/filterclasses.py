"""Why a group fits nowhere, counted per class of nodes in the same state instead of node by node.

When nothing fits, placement counts every node's first failing reason (kube-scheduler's ``0/N nodes are
available: ...``): on a full cluster of 5,000 nodes that was a scan costing more than the decision it
explains, and preemption runs right after it. But the filters read little of a node apart from its CPU
and memory: whether it is open, its taints, its device counts, what its partly used devices have left,
what its devices declare. Nodes alike in all that (most of a full cluster) fail alike; so the nodes are
kept grouped by that *class*, a class is asked once per request, and only the nodes of a class that
passes everything but CPU and memory are asked those, one by one.

Names and labels are not part of a class: a request that reads them (a group ``nodeSelector``, a pod's
``nodeSelector`` or required node affinity) is answered node by node (:func:`FilterClasses.explain` says
None). The classes follow the ledger's snapshots as :mod:`fgdindex` does: only shards the ledger copied
since the last call are read, their nodes compared by identity. The answer equals the scan's
(tests/core/test_filter_classes.py).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable, Hashable, Mapping

from deviceshare.core import filters, inventory, reasons, snapshots

# The filter's first failing reason for a node's state (placement's own), None when it fits.
Failure = Callable[[snapshots.NodeState], "str | None"]
_RESOURCES = frozenset({reasons.INSUFFICIENT_CPU, reasons.INSUFFICIENT_MEMORY})


def class_of(state: snapshots.NodeState) -> Hashable:
    """What the filters read of a node apart from its name, labels, CPU and memory (device ids left out)."""
    info = state.info
    return (
        info.shared, info.ready, info.unschedulable, bool(info.problems), info.taints, info.mps_ready,
        tuple(sorted((r, len(ids)) for r, ids in info.devices.items() if ids)),
        tuple(sorted(info.device_memory.items())),
        tuple(sorted(info.device_tiles.items())),
        tuple(sorted((r, len(ids)) for r, ids in state.free.items() if ids)),
        tuple(sorted(
            (r, tuple(sorted((left.kind.value, left.compute_milli, left.memory_bytes is None, left.memory_bytes or 0,
                              len(left.free_tiles)) for left in lefts)))
            for r, lefts in state.partial.items() if lefts
        )),
    )


def reads_names(group_selector: Mapping[str, str], pod: inventory.PodDemand) -> bool:
    """Does the request read node names or labels (which classes do not keep)?"""
    return bool(group_selector or pod.node_selector or pod.required_terms)


class FilterClasses:
    """Every node of the ledger's snapshots, grouped by :func:`class_of`; one per ledger."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # decisions may run on several threads; catching up is not atomic
        self._follower = snapshots.Follower()
        self._class: dict[str, Hashable] = {}
        self._members: dict[Hashable, dict[str, snapshots.NodeState]] = {}

    def explain(
        self, snapshot: snapshots.LedgerSnapshot, group_selector: Mapping[str, str], pod: inventory.PodDemand,
        failure: Failure,
    ) -> dict[str, int] | None:
        """Every node's first failing reason, counted, for a group whose first pod is ``pod``; None when
        the request reads names or labels (then the caller asks node by node). ``failure`` is placement's
        filter for the same pod asking no CPU or memory (:func:`without_resources`)."""
        if reads_names(group_selector, pod):
            return None
        counted: collections.Counter[str] = collections.Counter()
        with self._lock:
            self._catch_up(snapshot)
            for members in self._members.values():
                reason = failure(next(iter(members.values())))
                if reason is not None and reason not in _RESOURCES:
                    counted[reason] += len(members)
                    continue
                # The class passes all but CPU and memory (the one node asked may differ there): node by node.
                for state in members.values():
                    short = filters.resources_failure(state.info, pod, state.cpu_used, state.memory_used)
                    if short is not None:
                        counted[short] += 1
        return dict(counted)

    @property
    def classes(self) -> int:
        return len(self._members)

    def _catch_up(self, snapshot: snapshots.LedgerSnapshot) -> None:
        for name, state in self._follower.changes(snapshot):
            self._file(name, state)

    def _file(self, name: str, state: snapshots.NodeState | None) -> None:
        previous = self._class.pop(name, None)
        if previous is not None:
            members = self._members[previous]
            del members[name]
            if not members:
                del self._members[previous]
        if state is None:
            return
        key = self._class[name] = class_of(state)
        self._members.setdefault(key, {})[name] = state


def without_resources(pod: inventory.PodDemand) -> inventory.PodDemand:
    """The pod asking no CPU or memory: a class is asked everything else."""
    return dataclasses.replace(pod, cpu_milli=0, memory_bytes=0)
