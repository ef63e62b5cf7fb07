"""Which of a node's free device IDs a group gets: the best-linked set where the node reports its topology,
else a contiguous run where one exists.

Its own module because both placements (whole devices, :mod:`placement`, and shares,
:mod:`shareplacement`) pick fresh devices the same way.

With a topology (:mod:`topology`, CONTRACT §9) the set of ``count`` free devices is chosen by, in order:
its worst link (NVLink before one PCIe switch before several, a host bridge, one NUMA node, across
sockets), the sum of its links' classes, more NVLinks, then what it leaves behind — the fewest close links
broken between the set and the devices left free, so a 1-GPU group takes a GPU from an island already in
use and keeps a whole NVLink island for a 4-GPU group — and last the inventory order. Up to
:data:`EXHAUSTIVE` free devices every set is weighed; beyond, a greedy growth from each seed. The
answer depends only on (topology, free devices, count), so it is cached: the nodes of one server model
share one :class:`topology.Topology`, and a busy cluster asks the same questions again and again.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

from deviceshare.core import topology as topologies

EXHAUSTIVE = 10  # at most C(10, 5) = 252 sets are weighed one by one


def choose_devices(
    offered: Sequence[str], free: Sequence[str], count: int, topology: topologies.Topology | None = None
) -> tuple[str, ...]:
    """``count`` of the ``free`` IDs (in inventory order), deterministically.

    With ``topology``: the best-linked set (module docstring). Without: a contiguous run
    (consecutive positions in the node's inventory order), the shortest that fits so longer runs stay
    whole for bigger groups, the earliest on ties; without one, the first free IDs in inventory order.
    """
    if count <= 0:
        return ()
    if len(free) == count:
        return tuple(free)
    if topology is not None and count < len(free):
        return best_linked(topology, tuple(free), count)
    position = {d: i for i, d in enumerate(offered)}
    best_start, best_len = -1, 0
    run_start, run_len, last = 0, 0, -2
    for i, device in enumerate(free):
        pos = position.get(device, -2)
        if pos == last + 1 and run_len:
            run_len += 1
        else:
            if count <= run_len and (best_start < 0 or run_len < best_len):
                best_start, best_len = run_start, run_len
            run_start, run_len = i, 1
        last = pos
    if count <= run_len and (best_start < 0 or run_len < best_len):
        best_start, best_len = run_start, run_len
    if best_start >= 0:
        return tuple(free[best_start:best_start + count])
    return tuple(free[:count])


@functools.lru_cache(maxsize=1 << 16)
def best_linked(topology: topologies.Topology, free: tuple[str, ...], count: int) -> tuple[str, ...]:
    """The best-linked ``count`` of ``free`` (see the module docstring); ``free`` in inventory order."""
    n = len(free)
    if count >= n:
        return free
    pos = [topology.position.get(d, -1) for d in free]
    unknown = topologies.UNKNOWN
    cls = [[0 if x == y else (unknown if pos[x] < 0 or pos[y] < 0 else topology.classes[pos[x]][pos[y]])
            for y in range(n)] for x in range(n)]
    nv = [[0 if pos[x] < 0 or pos[y] < 0 else topology.links_nv[pos[x]][pos[y]] for y in range(n)]
          for x in range(n)]
    # How close each free device is to the others: a set that takes devices close to many devices it
    # leaves free breaks an island; one whose neighbours are already taken does not.
    close = unknown + 1
    row = [sum(close - cls[x][y] for y in range(n) if y != x) for x in range(n)]

    def key(combo: Sequence[int]) -> tuple[int, int, int, int, tuple[int, ...]]:
        worst = total = links = 0
        for i, x in enumerate(combo):
            cx, nx = cls[x], nv[x]
            for y in combo[i + 1:]:
                c = cx[y]
                total += c
                links += nx[y]
                if c > worst:
                    worst = c
        pairs = len(combo) * (len(combo) - 1) // 2
        broken = sum(row[x] for x in combo) - 2 * (pairs * close - total)
        return worst, total, -links, broken, tuple(sorted(combo))

    if n <= EXHAUSTIVE:
        best = min(itertools.combinations(range(n), count), key=key)
    else:
        best = min((_grown(seed, count, cls, nv, row) for seed in range(n)), key=key)
    return tuple(free[x] for x in sorted(best))


def _grown(
    seed: int, count: int, cls: list[list[int]], nv: list[list[int]], row: list[int]
) -> tuple[int, ...]:
    """A set grown from ``seed`` by adding, each time, the device with the best links to those taken."""
    taken = [seed]
    rest = [y for y in range(len(cls)) if y != seed]
    while len(taken) < count:
        pick = min(rest, key=lambda y: (max(cls[x][y] for x in taken), sum(cls[x][y] for x in taken),
                                        -sum(nv[x][y] for x in taken), row[y], y))
        taken.append(pick)
        rest.remove(pick)
    return tuple(taken)


def quality(topology: topologies.Topology | None, ids: Sequence[str]) -> topologies.Quality:
    """How well ``ids`` are linked (smaller is better); without a topology, worse than any known link."""
    if len(ids) < 2:
        return topologies.PERFECT
    if topology is None:  # as if every pair were a link the node did not describe
        return topologies.UNKNOWN, topologies.UNKNOWN * (len(ids) * (len(ids) - 1) // 2)
    return topology.quality(ids)
