"""Node scoring's last word: among equally scored nodes, the one where the group's devices are best linked.

binpack, spread and fgd each rank nodes; where they tie (kube-scheduler would break the tie at random,
we take the node name that sorts first), a group of several devices prefers the node whose best-linked
set of free devices (:mod:`devicechoice`) has the better links — a 4-GPU group goes to a node with a free
NVLink island rather than one whose four free GPUs sit across sockets. Their order is otherwise kept: a
better link never beats a better score.

Like kube-scheduler's ``percentageOfNodesToScore``, which stops once it has found enough feasible nodes,
the tie is broken among the first :data:`WINDOW` feasible nodes of the best score in name order (or fewer:
a set linked by NVLink throughout cannot be beaten, so the walk stops there). A cluster whose nodes report
no topology skips all this (``LedgerSnapshot.linked_nodes == 0``): its decisions are exactly as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from deviceshare.core import devicechoice, snapshots
from deviceshare.core import topology as topologies

WINDOW = 16

LinkQuality = tuple[topologies.Quality, ...]  # per multi-device resource, by name; smaller is better


def applies(snapshot: snapshots.LedgerSnapshot, resources: Mapping[str, int]) -> bool:
    """Whether links can decide anything: some node reports a topology and the group takes several devices."""
    return snapshot.linked_nodes > 0 and any(n >= 2 for n in resources.values())


def quality(state: snapshots.NodeState, resources: Mapping[str, int]) -> LinkQuality:
    """How well the devices the group would get on ``state`` are linked (whole devices; a node that fits)."""
    info = state.info
    out = []
    for resource in sorted(resources):
        need = resources[resource]
        if need < 2:
            continue
        topo = info.topology.get(resource)
        free = state.free.get(resource, ())
        if topo is None:
            out.append(devicechoice.quality(None, free[:need]))
        else:
            out.append(devicechoice.linked_quality(topo, free, need))
    return tuple(out)


def _perfect(q: LinkQuality) -> bool:
    return all(x == topologies.PERFECT for x in q)


def prefer(
    first: snapshots.NodeState,
    rest: Iterator[snapshots.NodeState],
    score: Callable[[snapshots.NodeState], object],
    fits: Callable[[snapshots.NodeState], bool],
    resources: Mapping[str, int],
) -> snapshots.NodeState:
    """``first`` (the first feasible node of the best score) or a better-linked one among the nodes that
    follow it in ``rest`` with the same ``score``, up to :data:`WINDOW` feasible nodes in all (name order kept
    on equal links). ``rest`` must yield nodes in score, then name, order; it is read no further than needed."""
    best, best_q = first, quality(first, resources)
    first_score = score(first)
    seen = 1
    if _perfect(best_q):
        return best
    for state in rest:
        if seen >= WINDOW or score(state) != first_score:
            break
        if not fits(state):
            continue
        seen += 1
        q = quality(state, resources)
        if q < best_q:
            best, best_q = state, q
            if _perfect(q):
                break
    return best


def best_of(tied: Iterable[snapshots.NodeState], resources: Mapping[str, int]) -> snapshots.NodeState:
    """The reference form of :func:`prefer`: ``tied`` are feasible nodes of the best score, in name order."""
    window = list(tied)[:WINDOW]
    return min(window, key=lambda s: (quality(s, resources), s.info.name))
