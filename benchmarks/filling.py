"""Filling a benchmark cluster to ~70% of its GPUs before the timed churn starts.

``bench_core``, ``bench_core_shares`` and ``bench_core_fgd`` all time decisions on a cluster kept at
that level; they differ only in the groups they make and how a group is placed, so the fill loop is
one function here and each benchmark hands in its own two.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from deviceshare.core import inventory, ledger, placement

GPU = "nvidia.com/gpu"
LEVEL = 0.7  # the share of the cluster's GPUs taken before timing starts

Key = tuple[str, str]
MakeRequest = Callable[[Key], tuple[placement.GroupRequest, inventory.PodDemand]]
# Places a group and returns the devices it got, or None when it was not placed.
Place = Callable[[placement.GroupRequest, inventory.PodDemand], Mapping[str, Sequence[str]] | None]


def fill(nodes: int, gpus: int, make_request: MakeRequest, place: Place) -> list[Key]:
    """Place groups ``("fill", "g<n>")`` until ~70% of the GPUs are taken (a share counts its compute,
    so a group of a fifth of a GPU counts a fifth); the keys of the groups placed, in order."""
    live: list[Key] = []
    target, allocated, n = int(nodes * gpus * LEVEL), 0.0, 0
    while allocated < target:
        request, pod = make_request(("fill", f"g{n}"))
        n += 1
        devices = place(request, pod)
        if devices is not None:
            live.append(request.key)
            s = request.share.get(GPU)
            allocated += s.compute_milli / 1000 if s else sum(len(ids) for ids in devices.values())
    return live


def scheduling(book: ledger.DeviceLedger) -> Place:
    """Place as the operator's scheduler does: decide and reserve in one call."""

    def place(request: placement.GroupRequest, pod: inventory.PodDemand) -> Mapping[str, Sequence[str]] | None:
        got = placement.schedule_group(book, request, pod)
        return got.devices if isinstance(got, ledger.Allocation) else None

    return place
