"""How the operator's FGD sees groups and nodes: a group's shape, a node's per-device free values, the device
a share takes.

The FGD engine (:mod:`fgd`) rates node *signatures* for group *shapes*; this is the translation from the
ledger's terms (a group's resources and shares, its first pod's CPU; a node's free, partly used and held
devices) into the engine's, and back (which device of the chosen node has a best-scoring free value).
:mod:`fgdplacement` decides with it; the simulator needs none of it (its nodes are signatures already).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from deviceshare.api import models
from deviceshare.core import capacity, inventory, workloadmix
from deviceshare.core import fragmentation as frag
from deviceshare.core import ledger as ledgers
from deviceshare.core import placement as placements


def lead_resource(request: placements.GroupRequest) -> str | None:
    if request.share:
        return min(request.share)
    return min(request.resources) if request.resources else None


def shape_of(resources: Mapping[str, int], share: Mapping[str, capacity.Share], cpu_milli: int) -> frag.Shape | None:
    """The group's shape on its leading resource; None for a share without a compute part."""
    if share:
        resource = min(share)
        milli = share[resource].compute_milli
        if not milli:
            return None
        return frag.Shape(cpu_milli, min(milli, frag.MILLI), resources[resource], resource)
    if not resources:
        return frag.Shape(cpu_milli, 0, 0, "")
    resource = min(resources)
    return frag.Shape(cpu_milli, frag.MILLI, resources[resource], resource)


def seed_histogram(
    groups: Iterable[tuple[models.GroupSpec, Sequence[inventory.PodDemand]]],
    half_life: float = workloadmix.DEFAULT_HALF_LIFE,
) -> workloadmix.ShapeHistogram:
    """The target workload at start: one count per existing group, CPU from its first member if any."""
    shapes = []
    for spec, pods in groups:
        cpu = pods[0].cpu_milli if pods else 0
        shape = shape_of(dict(spec.resources), capacity.shares_from_spec(spec.share), cpu)
        if shape is not None:
            shapes.append(shape)
    return workloadmix.ShapeHistogram.seeded(shapes, half_life)


def free_values(state: ledgers.NodeState, resource: str) -> dict[str, int]:
    """Device -> free compute milli, in inventory order (held, mixed or tile-split devices: 0)."""
    free = set(state.free.get(resource, ()))
    left = {
        d.device: max(d.compute_milli, 0)
        for d in state.partial.get(resource, ())
        if d.kind is capacity.Kind.SHARED
    }
    return {
        d: frag.MILLI if d in free else left.get(d, 0) for d in state.info.devices.get(resource, ())
    }



def device_for(
    state: ledgers.NodeState, resource: str, share: capacity.Share, values: tuple[int, ...]
) -> str | None:
    """The first device (inventory order) with a best-scoring free value that really takes the share."""
    partial = {d.device: d for d in state.partial.get(resource, ())}
    free = set(state.free.get(resource, ()))
    memory_cap, tiles_cap = state.info.device_memory.get(resource), state.info.device_tiles.get(resource, 0)
    for device, value in free_values(state, resource).items():
        if value not in values:
            continue
        left = partial.get(device)
        if left is None and device in free:
            left = capacity.fresh(device, memory_cap, tiles_cap, share.kind)
        if left is not None and capacity.fits(left, share):
            return device
    return None
