"""The hand-over of a DRA group's devices (CONTRACT §13): its ResourceClaim ``<group>-devices`` allocated by us,
as kube-scheduler's DRA plugin allocates one (KEP-4381: a scheduler other than kube-scheduler writes
``status.allocation`` and ``status.reservedFor`` before it binds).

The scheduling phases decide *which* devices, as for every group (the ledger holds them, the group's status
records them); this module turns that decision into what the kubelet and the driver read:

- before each member's Binding, :func:`reserve_for`: the claim's ``status.allocation`` (one result per device,
  ``request: devices``; a ``nodeSelector`` with one ``matchFields`` term on ``metadata.name``, as kube-scheduler
  writes it for node-local devices: pkg/scheduler/framework/plugins/dynamicresources/allocator) and the pod in
  ``status.reservedFor`` (``{resource: pods, name, uid}``), in one write, conditional on the claim's
  resourceVersion (``storage.ClusterApi.patch_claim_status``: an uncertain answer is read back);
- :func:`prune_reserved`: a member that is gone leaves ``reservedFor``;
- :func:`release_claim_allocation`: before the ledger gives the devices back (group deleted and no member runs,
  preempted, node lost, a placement rolled back), ``reservedFor`` emptied and the allocation cleared, in one
  write (kube-apiserver refuses ``reservedFor`` without an allocation, so both go together). Then the claim itself
  may be deleted (its owner's job). A claim whose allocation is not what the ledger holds for the group is left
  alone: that allocation is not ours to clear.

A claim read or written is remembered (``DraInventory.bodies``): the members of a gang bound in one cycle cost
one read.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from deviceshare.api import names
from deviceshare.core import ledger as ledgers

from . import drainventory, storage
from . import state as state_
from .context import Context

logger = logging.getLogger(__name__)

REQUEST = "devices"  # the name of the one request of a group's claim (CONTRACT §13)
RESERVED_FOR_MAX = 256  # kube-apiserver's limit on status.reservedFor
WRITES = 5  # conditional writes tried before the claim is left for a later cycle


def claim_key(group: state_.GroupKey) -> tuple[str, str]:
    return (group[0], names.claim_name(group[1]))


def allocation_body(
    dra: drainventory.DraInventory, allocation: ledgers.Allocation, group: state_.GroupRecord | None = None
) -> dict[str, Any]:
    """``status.allocation`` for the ledger's allocation of a DRA group (its one resource: the DeviceClass). A
    group with a share (``spec.share[class].capacity``) gets, per device, the capacity it consumes and a
    ``shareID`` (KEP-5075), the same for the same group and device whenever it is written again."""
    results: list[dict[str, Any]] = []
    spec = group.spec if group is not None else None
    for resource, ids in sorted(allocation.devices.items()):
        share = spec.share.get(resource) if spec is not None and resource in allocation.share else None
        for device_id in ids:
            device = dra.device(device_id)
            if device is None:
                raise storage.RetryLater(f"device {device_id} is in no ResourceSlice of node {allocation.node} now")
            result: dict[str, Any] = {"request": REQUEST, "driver": device.driver, "pool": device.pool,
                                      "device": device.name}
            if share is not None and share.capacity is not None and group is not None:
                result["shareID"] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{group.uid}/{device_id}"))
                result["consumedCapacity"] = dict(share.capacity)
            results.append(result)
    return {
        "devices": {"results": results},
        "nodeSelector": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [allocation.node]}]}]},
    }


def shows(claim: Mapping[str, Any], allocation: Mapping[str, Any]) -> bool:
    """Whether the claim's allocation is this one (the same results; the API may add fields of its own)."""
    def results(value: Any) -> list[tuple[str, ...]]:
        listed = ((value or {}).get("devices") or {}).get("results") or []
        return sorted((str(r.get("request")), str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
                      for r in listed)
    shown = (claim.get("status") or {}).get("allocation")
    return shown is not None and results(shown) == results(allocation)


def _meta(claim: Mapping[str, Any]) -> Mapping[str, Any]:
    return claim.get("metadata") or {}


def _reserved(claim: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list((claim.get("status") or {}).get("reservedFor") or [])


async def _read(ctx: Context, group: state_.GroupKey) -> dict[str, Any] | None:
    return ctx.dra.bodies.keep(group, await ctx.api.read_claim(claim_key(group)))


async def reserve_for(
    ctx: Context, group: state_.GroupRecord, allocation: ledgers.Allocation, pod: state_.PodRecord
) -> None:
    """The claim allocated as the ledger holds it and ``pod`` among its consumers, before the pod is bound.

    Raises ``RetryLater`` (the claim does not exist yet, its slices are not seen, it kept changing: bind later),
    ``Invalid`` (the claim is allocated to other devices than ours, by someone else: this group cannot use it),
    or what the write raises."""
    wanted = allocation_body(ctx.dra, allocation, group)
    consumer = {"resource": "pods", "name": pod.key[1], "uid": pod.uid}
    claim = ctx.dra.bodies.get(group.key)
    for attempt in range(WRITES):
        if claim is None or attempt:
            claim = await _read(ctx, group.key)
        if claim is None:
            raise storage.RetryLater(f"ResourceClaim {group.key[0]}/{names.claim_name(group.name)} does not exist "
                                     "yet", delay=0.5)
        owners = [r for r in _meta(claim).get("ownerReferences") or [] if r.get("controller")]
        if not any(r.get("uid") == group.uid for r in owners):
            raise storage.Invalid(f"ResourceClaim {names.claim_name(group.name)} is not owned by this group")
        allocated = (claim.get("status") or {}).get("allocation") is not None
        if allocated and not shows(claim, wanted):
            raise storage.Invalid(f"ResourceClaim {names.claim_name(group.name)} is allocated to other devices "
                                  "than the group's, by another scheduler")
        reserved = _reserved(claim)
        if allocated and any(r.get("uid") == pod.uid for r in reserved):
            return
        if len(reserved) >= RESERVED_FOR_MAX:
            raise storage.Invalid(f"ResourceClaim {names.claim_name(group.name)} reserves {RESERVED_FOR_MAX} pods "
                                  "already, the most the API allows")
        status: dict[str, Any] = {"reservedFor": [*reserved, consumer]}
        if not allocated:
            status["allocation"] = wanted
        try:
            ctx.dra.bodies.keep(group.key, await ctx.api.patch_claim_status(
                claim_key(group.key), status, uid=str(_meta(claim).get("uid")),
                resource_version=str(_meta(claim).get("resourceVersion"))))
            return
        except storage.Conflict:
            ctx.metrics.api_conflicts.inc()
            continue
        except storage.Gone:
            ctx.dra.bodies.forget(group.key)
            raise storage.RetryLater(f"ResourceClaim {names.claim_name(group.name)} is gone", delay=0.5) from None
        except storage.Uncertain:
            ctx.dra.bodies.forget(group.key)  # the next try reads it again
            raise
    raise storage.RetryLater(f"ResourceClaim {names.claim_name(group.name)} kept changing", delay=0.2)


async def prune_reserved(ctx: Context, group: state_.GroupKey, live: Iterable[str]) -> None:
    """Members that are gone (their uids not in ``live``) leave ``reservedFor``. The claim is read once per term
    (after a restart, members may have gone while nobody watched), then only when our last copy names one."""
    alive = set(live)
    claim = ctx.dra.bodies.get(group)
    if claim is None:
        claim = await _read(ctx, group)
    if claim is None or all(r.get("uid") in alive for r in _reserved(claim)):
        return
    for attempt in range(WRITES):
        if attempt:
            claim = await _read(ctx, group)
        if claim is None:
            return
        kept = [r for r in _reserved(claim) if r.get("uid") in alive]
        if len(kept) == len(_reserved(claim)):
            return
        if await _settled(ctx, group, claim, {"reservedFor": kept or None}):
            return


async def release_claim_allocation(
    ctx: Context, group: state_.GroupKey, allocation: ledgers.Allocation | None
) -> None:
    """Before the ledger releases ``allocation``: the claim's ``reservedFor`` emptied and its allocation cleared
    (one write, conditional). Returns once the API shows no allocation of ours on the claim (or no claim); raises
    what the write raises otherwise (the caller keeps the devices held and tries again later). An allocation
    that is not the ledger's for this group is left as it is."""
    if allocation is None:
        return
    ours = {d for ids in allocation.devices.values() for d in ids}
    for _ in range(WRITES):
        claim = await _read(ctx, group)
        if claim is None or (claim.get("status") or {}).get("allocation") is None:
            return
        if allocated_ids(claim) != ours:
            logger.info("ResourceClaim %s/%s: its allocation is not the one deviceshare made; left as it is",
                        *claim_key(group))
            return
        if await _settled(ctx, group, claim, {"reservedFor": None, "allocation": None}):
            return
    raise storage.RetryLater(f"ResourceClaim {claim_key(group)[1]} kept changing while it was released", delay=0.2)


async def _settled(ctx: Context, group: state_.GroupKey, claim: Mapping[str, Any], status: dict[str, Any]) -> bool:
    """Write ``status`` on the claim, conditional on the version read: True once written (or the claim is gone),
    False when it changed meanwhile (read it again and decide again)."""
    try:
        ctx.dra.bodies.keep(group, await ctx.api.patch_claim_status(
            claim_key(group), status, uid=str(_meta(claim).get("uid")),
            resource_version=str(_meta(claim).get("resourceVersion"))))
    except storage.Conflict:
        ctx.metrics.api_conflicts.inc()
        return False
    except storage.Gone:
        ctx.dra.bodies.forget(group)
    return True


def allocated_ids(claim: Mapping[str, Any]) -> set[str]:
    """``<pool>/<device>`` of every result of the claim's allocation."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    return {drainventory.device_id(str(r.get("pool")), str(r.get("device"))) for r in results}


def is_dra(group: state_.GroupRecord | None) -> bool:
    return group is not None and group.spec is not None and group.spec.is_dra


def holds_claim(ctx: Context, group: state_.GroupRecord | None, key: state_.GroupKey) -> bool:
    """Whether releasing ``key`` must first release its claim: a DRA group, or (the group gone) one whose claim
    the inventory shows allocated, or our last copy of it does (a write of ours its watch event has not shown)."""
    if is_dra(group):
        return True
    written = ctx.dra.bodies.get(key)
    return group is None and (ctx.dra.allocation(claim_key(key)) is not None
                              or (written is not None and bool((written.get("status") or {}).get("allocation"))))

