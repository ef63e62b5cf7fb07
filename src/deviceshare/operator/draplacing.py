"""The DRA hooks of the placement phases (CONTRACT §13): a group's claim selectors narrow the snapshot it is placed
on, and when nothing fits, the reasons are said in DRA's terms. Everything else (filters, binpack / spread / fgd,
gang, nominations) is the core's, the same as for device-plugin groups: a DRA group's resource is its DeviceClass.
"""

from __future__ import annotations

import asyncio

from deviceshare.api import models
from deviceshare.core import drareasons, eligibility, inventory, placement
from deviceshare.core import ledger as ledgers

from .context import Context


def _selectors(spec: models.GroupSpec) -> list[str]:
    return [str(s) for s in spec.claim.selectors] if spec.claim is not None else []


def refusal(spec: models.GroupSpec) -> str | None:
    """A DRA share the ledger cannot count: it counts device ``memory``; other capacities are refused by name."""
    for resource, share in sorted(spec.share.items()):
        other = sorted(set(share.capacity or {}) - {"memory"})
        if spec.is_dra and other:
            return (f"spec.share[{resource}].capacity asks for {', '.join(other)}: deviceshare shares DRA devices "
                    "by memory only")
    return None


async def prepare(ctx: Context, spec: models.GroupSpec) -> None:
    """Before the placement's no-await stretch: the claim's selectors evaluated over every device in a worker
    thread (``DraInventory.excluded_work``), unless known already; the decision then finds them cached."""
    selectors = _selectors(spec)
    if spec.claim is None or not selectors or ctx.dra.has_excluded(spec.claim.device_class_name, selectors):
        return
    generation = ctx.dra.generation
    found = await asyncio.to_thread(ctx.dra.excluded_work(spec.claim.device_class_name, selectors))
    ctx.dra.keep_excluded(spec.claim.device_class_name, selectors, generation, found)


def excluded(ctx: Context, spec: models.GroupSpec) -> dict[str, frozenset[str]] | None:
    """Per node, the devices of the group's class its claim's selectors do not match (None: no selectors)."""
    selectors = _selectors(spec)
    if spec.claim is None or not selectors:
        return None
    return ctx.dra.excluded(spec.claim.device_class_name, selectors)


def narrowed(ctx: Context, spec: models.GroupSpec, snapshot: ledgers.LedgerSnapshot) -> ledgers.LedgerSnapshot:
    """The snapshot with only the devices the group's selectors match offered."""
    left_out = excluded(ctx, spec)
    if spec.claim is None or left_out is None:
        return snapshot
    memo = ctx.dra.narrowed(spec.claim.device_class_name, _selectors(spec))
    return eligibility.restrict(snapshot, spec.claim.device_class_name, left_out, memo)


def explained(
    ctx: Context, spec: models.GroupSpec, unschedulable: placement.Unschedulable,
    snapshot: ledgers.LedgerSnapshot, request: placement.GroupRequest, pod: inventory.PodDemand,
) -> placement.Unschedulable:
    """Why nothing fits, each node short of devices of the class told apart (``core/drareasons``)."""
    if not spec.is_dra:
        return unschedulable
    return drareasons.refine(unschedulable, snapshot, request, pod, excluded(ctx, spec))
