"""Which of a node's free device IDs a group gets: a contiguous run where one exists.

Its own module because both placements (whole devices, :mod:`placement`, and shares,
:mod:`shareplacement`) pick fresh devices the same way.
"""

from __future__ import annotations

from collections.abc import Sequence


def choose_devices(offered: Sequence[str], free: Sequence[str], count: int) -> tuple[str, ...]:
    """``count`` of the ``free`` IDs, deterministically.

    Prefers a contiguous run (consecutive positions in the node's inventory order), taking the
    shortest run that fits so longer runs stay whole for bigger groups, the earliest on ties;
    without one, the first free IDs in inventory order.
    """
    if count <= 0:
        return ()
    if len(free) == count:
        return tuple(free)
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
