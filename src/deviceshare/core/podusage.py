"""The cpu and memory that pods bound to each node request: the part of a node's room that is not devices.

The ledger accounts every pod bound to a node, whatever scheduler placed it, so a group's first pod
(and a member joining its group's node) is filtered against what the node has left beside them, as
kube-scheduler's NodeResourcesFit counts requests, not use. This is the tally alone; the ledger takes
its lock around it, recomputes the nodes it touched and bumps its revision.
"""

from __future__ import annotations

from collections.abc import Iterable

from deviceshare.core import inventory

PodKey = inventory.PodKey


class PodUsage:
    """Per pod, the node it is accounted on and its (cpu milli, memory bytes); per node, their sums."""

    def __init__(self) -> None:
        self._pods: dict[PodKey, tuple[str, int, int]] = {}
        self._used: dict[str, tuple[int, int]] = {}

    def account(self, pods: Iterable[tuple[PodKey, str, int, int]]) -> set[str]:
        """Record (pod, node, cpu_milli, memory_bytes) for each pod, replacing what it had; idempotent.
        Returns the nodes whose sums changed."""
        touched: set[str] = set()
        for pod, node, cpu_milli, memory_bytes in pods:
            entry = (node, cpu_milli, memory_bytes)
            previous = self._pods.get(pod)
            if previous == entry:
                continue
            if previous is not None:
                self._count(previous[0], -previous[1], -previous[2])
                touched.add(previous[0])
            self._pods[pod] = entry
            self._count(node, cpu_milli, memory_bytes)
            touched.add(node)
        return touched

    def forget(self, pod: PodKey) -> str | None:
        """Take a pod's requests off its node; the node, or None if the pod was not accounted."""
        previous = self._pods.pop(pod, None)
        if previous is None:
            return None
        self._count(previous[0], -previous[1], -previous[2])
        return previous[0]

    def on(self, node: str) -> tuple[int, int]:
        """(cpu_milli, memory_bytes) requested by the accounted pods on ``node``."""
        return self._used.get(node, (0, 0))

    def _count(self, node: str, cpu: int, memory: int) -> None:
        old_cpu, old_mem = self._used.get(node, (0, 0))
        new = (old_cpu + cpu, old_mem + memory)
        if new == (0, 0):
            self._used.pop(node, None)
        else:
            self._used[node] = new
