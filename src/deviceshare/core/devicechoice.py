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
    if len(topology.devices) <= EXHAUSTIVE and min(pos) >= 0:
        return _from_ranked(topology, free, pos, count)
    unknown = topologies.UNKNOWN
    cls = [[0 if x == y else (unknown if pos[x] < 0 or pos[y] < 0 else topology.classes[pos[x]][pos[y]])
            for y in range(n)] for x in range(n)]
    nv = [[0 if pos[x] < 0 or pos[y] < 0 else topology.links_nv[pos[x]][pos[y]] for y in range(n)]
          for x in range(n)]
    row = _closeness(cls)

    def key(combo: Sequence[int]) -> tuple[int, int, int, int, tuple[int, ...]]:
        worst, total, links = _links(combo, cls, nv)
        return worst, total, -links, _broken(combo, cls, row, total), tuple(sorted(combo))

    if n <= EXHAUSTIVE:
        best = min(itertools.combinations(range(n), count), key=key)
    else:
        best = min((_grown(seed, count, cls, nv, row) for seed in range(n)), key=key)
    return tuple(free[x] for x in sorted(best))


def _links(combo: Sequence[int], cls: Sequence[Sequence[int]], nv: Sequence[Sequence[int]]) -> tuple[int, int, int]:
    """(worst link class, sum of classes, NVLinks) over the pairs of ``combo``."""
    worst = total = links = 0
    for i, x in enumerate(combo):
        cx, nx = cls[x], nv[x]
        for y in combo[i + 1:]:
            c = cx[y]
            total += c
            links += nx[y]
            if c > worst:
                worst = c
    return worst, total, links


# How close each free device is to the others: a set that takes devices close to many devices it leaves
# free breaks an island; one whose neighbours are already taken does not.
_CLOSE = topologies.UNKNOWN + 1


def _closeness(cls: Sequence[Sequence[int]]) -> list[int]:
    return [sum(_CLOSE - cls[x][y] for y in range(len(cls)) if y != x) for x in range(len(cls))]


def _broken(combo: Sequence[int], cls: Sequence[Sequence[int]], row: Sequence[int], total: int) -> int:
    pairs = len(combo) * (len(combo) - 1) // 2
    return sum(row[x] for x in combo) - 2 * (pairs * _CLOSE - total)


@functools.lru_cache(maxsize=1024)
def _ranked(topology: topologies.Topology, count: int) -> tuple[tuple[tuple[int, int, int], int, tuple[int, ...]], ...]:
    """Every ``count``-set of the topology's devices, best linked first: (key, bit mask, positions).

    Weighed once per server model and size; a decision then takes the first sets that are all free.
    """
    cls, nv = topology.classes, topology.links_nv
    ranked = []
    for combo in itertools.combinations(range(len(topology.devices)), count):
        worst, total, links = _links(combo, cls, nv)
        ranked.append(((worst, total, -links), sum(1 << x for x in combo), combo))
    ranked.sort()
    return tuple(ranked)


def _from_ranked(topology: topologies.Topology, free: tuple[str, ...], pos: list[int], count: int) -> tuple[str, ...]:
    """:func:`best_linked` for a node whose every free device the topology describes (the usual case)."""
    mask = sum(1 << p for p in pos)
    best: tuple[int, int, int] | None = None
    tied: list[tuple[int, ...]] = []
    for key, bits, combo in _ranked(topology, count):
        if bits & mask != bits:
            continue
        if best is None:
            best = key
        elif key != best:
            break
        tied.append(combo)
    at = {p: i for i, p in enumerate(pos)}  # topology position -> index in ``free``
    if len(tied) == 1:
        chosen = [at[p] for p in tied[0]]
    else:  # equal links: what the set leaves behind, then the inventory order
        cls = [[topology.classes[a][b] for b in pos] for a in pos]
        row = _closeness(cls)
        assert best is not None
        chosen = min((sorted(at[p] for p in combo) for combo in tied),
                     key=lambda c: (_broken(c, cls, row, best[1]), c))
    return tuple(free[i] for i in sorted(chosen))


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


@functools.lru_cache(maxsize=1 << 16)
def linked_quality(topology: topologies.Topology, free: tuple[str, ...], count: int) -> topologies.Quality:
    """How well the set :func:`choose_devices` picks from ``free`` is linked (scoring asks this per node)."""
    ids = free if count >= len(free) else best_linked(topology, free, count)
    return topology.quality(ids[:count])


def quality(topology: topologies.Topology | None, ids: Sequence[str]) -> topologies.Quality:
    """How well ``ids`` are linked (smaller is better); without a topology, worse than any known link."""
    if len(ids) < 2:
        return topologies.PERFECT
    if topology is None:  # as if every pair were a link the node did not describe
        return topologies.UNKNOWN, topologies.UNKNOWN * (len(ids) * (len(ids) - 1) // 2)
    return topology.quality(ids)
