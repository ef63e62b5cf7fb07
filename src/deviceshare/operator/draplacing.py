"""The DRA hooks of the placement phases (CONTRACT §13): a group's claim selectors narrow the snapshot it is placed
on and the room preemption may make for it, and when nothing fits, the reasons are said in DRA's terms. Everything
else (filters, binpack / spread / fgd, gang, nominations, preemption) is the core's, the same as for device-plugin
groups: a DRA group's resource is its DeviceClass.
"""

from __future__ import annotations

import asyncio

from deviceshare.api import models
from deviceshare.core import drareasons, eligibility, inventory, placement
from deviceshare.core import ledger as ledgers

from .context import Context

PREPARE_TRIES = 3  # evaluations of a claim's selectors in one pre-filter while the slices keep changing


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
    for _ in range(PREPARE_TRIES):  # a slice that changed meanwhile makes the answer stale: evaluate again
        if spec.claim is None or not selectors or ctx.dra.has_excluded(spec.claim.device_class_name, selectors):
            return
        generation = ctx.dra.generation
        found = await asyncio.to_thread(ctx.dra.excluded_work(spec.claim.device_class_name, selectors))
        ctx.dra.keep_excluded(spec.claim.device_class_name, selectors, generation, found)


def excluded(ctx: Context, spec: models.GroupSpec) -> dict[str, frozenset[str]] | None:
    """Per node, the devices of the group's class its claim's selectors do not match, as :func:`prepare` evaluated
    them for the slices as they are now. None: no selectors, or not known now (see :func:`narrowed`)."""
    selectors = _selectors(spec)
    if spec.claim is None or not selectors:
        return None
    return ctx.dra.evaluated(spec.claim.device_class_name, selectors)


def narrowed(ctx: Context, spec: models.GroupSpec, snapshot: ledgers.LedgerSnapshot) -> ledgers.LedgerSnapshot | None:
    """The snapshot with only the devices the group's selectors match offered. None: a slice or class changed
    since :func:`prepare` evaluated the selectors (during the pre-filter's awaits): the decision waits for the next
    cycle, which evaluates them again in a worker thread; never here, on the event loop (a selector that reads
    each device's ``uuid`` takes minutes at 40,000 devices, longer than the Lease can wait)."""
    selectors = _selectors(spec)
    if spec.claim is None or not selectors:
        return snapshot
    left_out = ctx.dra.evaluated(spec.claim.device_class_name, selectors)
    if left_out is None:
        return None
    memo = ctx.dra.narrowed(spec.claim.device_class_name, selectors)
    return eligibility.restrict(snapshot, spec.claim.device_class_name, left_out, memo)


def ineligible(ctx: Context, spec: models.GroupSpec) -> eligibility.Ineligible | None:
    """What preemption must not count as room for the group: the devices of its class its claim's selectors do not
    match, held or free, as :func:`prepare` evaluated them (a group whose devices the preemptor cannot use is not a
    victim). None: not known now, as for :func:`narrowed` (never evaluated here, on the event loop)."""
    if spec.claim is None or not _selectors(spec):
        return eligibility.NONE
    left_out = excluded(ctx, spec)
    return None if left_out is None else eligibility.Ineligible(spec.claim.device_class_name, left_out)


def explained(
    ctx: Context, spec: models.GroupSpec, unschedulable: placement.Unschedulable,
    snapshot: ledgers.LedgerSnapshot, request: placement.GroupRequest, pod: inventory.PodDemand,
) -> placement.Unschedulable:
    """Why nothing fits, each node short of devices of the class told apart (``core/drareasons``)."""
    if not spec.is_dra:
        return unschedulable
    return drareasons.refine(unschedulable, snapshot, request, pod, excluded(ctx, spec))
