"""What a node's DRA devices stood for, remembered past its slices (``drainventory.py``: *one GPU is never offered
twice*): per node, the extended resources its DeviceClasses name and the devices it offered under them, as last seen
with slices. While a claim still allocates one of those devices, a node whose slices went away (its driver
unregistered) does not offer those extended resources.

Indexed by device too: a claim's event asks which nodes its devices stood for, and a walk over every node's memo
cost milliseconds per event at 5,000 nodes.
"""

from __future__ import annotations

from collections.abc import Iterable

Memo = tuple[frozenset[str], frozenset[str]]  # (extended resources, device ids)


class DraGpus:
    def __init__(self) -> None:
        self._by_node: dict[str, Memo] = {}
        # device id -> the nodes whose memo names it (almost always one: a tuple is a fifth of a set's memory)
        self._nodes: dict[str, tuple[str, ...]] = {}

    def get(self, node: str) -> Memo | None:
        return self._by_node.get(node)

    def remember(self, node: str, memo: Memo | None) -> None:
        """The node's memo now (None: forget it)."""
        old = self._by_node.get(node)
        if old == memo:
            return
        for d in old[1] if old is not None else ():
            nodes = tuple(n for n in self._nodes[d] if n != node)
            if nodes:
                self._nodes[d] = nodes
            else:
                del self._nodes[d]
        if memo is None:
            del self._by_node[node]
            return
        self._by_node[node] = memo
        for d in memo[1]:
            nodes = self._nodes.get(d, ())
            if node not in nodes:
                self._nodes[d] = (*nodes, node)

    def nodes_of(self, devices: Iterable[str]) -> set[str]:
        """The nodes whose memo names one of ``devices``."""
        return {n for d in devices for n in self._nodes.get(d, ())}
