"""Pure builders of the SharedDeviceGroup status bodies the operator writes.

Every SharedDeviceGroup status the operator writes is built here, by one typed function per occasion:
:func:`bound` (a placement), :func:`rolled_back` (a placement undone before its first pod was bound),
:func:`node_lost` (devices released from a lost node) and :func:`reconciled` (the reconciler's view of
everything else). The scheduler and the reconciler list members the same way, :func:`member_names`, so
the placement's write is already what the reconciler would write once the pod is bound. Their conditions are
edited by ``conditions.py``; a member pod's annotations are built by ``memberannotations.py``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypedDict

from deviceshare.api import envnames, models, names
from deviceshare.core import gang, inventory, reasonkinds
from deviceshare.core import ledger as ledgers
from deviceshare.core import members as member_rules

from . import memberannotations
from . import state as state_
from .conditions import condition, same_conditions, wire_conditions, without_condition

# Re-exported: the scheduler asks for a member's annotations here.
allocation_annotations = memberannotations.allocation_annotations


def describe_devices(devices: Mapping[str, Sequence[str]]) -> str:
    return "; ".join(f"{r} {','.join(ids)}" for r, ids in sorted(devices.items()))


def describe_allocation(allocation: ledgers.Allocation) -> str:
    """``nvidia.com/gpu 0,1``, or with a share ``nvidia.com/gpu 0 (compute=460m,memory=12Gi)``, tiles named."""
    out = []
    for resource, ids in sorted(allocation.devices.items()):
        share = allocation.share.get(resource)
        text = f"{resource} {','.join(ids)}"
        if share is not None:
            tiles = allocation.tiles.get(resource)
            text += f" ({share.describe()}{': ' + ','.join(tiles) if tiles else ''})"
        out.append(text)
    return "; ".join(out)


def listed_members(
    pods: Iterable[state_.PodRecord], spec: models.GroupSpec | None, env_names: envnames.EnvNames
) -> list[state_.PodRecord]:
    """The pods a group's status lists as members: those we bound into it, and pending ones that pass the
    member rules the webhook applies. A pod the pre-bind check refuses (it joined after admission with the
    group's device resource or visibility env var) is no member, however its annotation names the group."""
    if spec is None:
        return [p for p in pods if p.member_of is not None]
    env = member_rules.visibility_env(spec.resources, env_names)
    return [
        p for p in pods
        if p.member_of is not None or next(member_rules.conflicts(p.containers, spec.resources, env), None) is None
    ]


# -- group status bodies ------------------------------------------------------------------------------

class StatusPatch(TypedDict, total=False):
    """A merge patch of a SharedDeviceGroup's status (CONTRACT §1); ``None`` removes a field."""

    phase: str
    nodeName: str | None
    allocatedDevices: dict[str, list[str]] | None
    allocatedTiles: dict[str, list[str]] | None
    members: list[str]
    memberCount: int
    observedGeneration: int
    conditions: list[dict[str, Any]]
    nominatedNodeName: str | None


class Scheduled(NamedTuple):
    """The ``Scheduled`` condition's status, reason and message."""

    status: str
    reason: str
    message: str


def member_names(cluster: state_.ClusterState, group: state_.GroupRecord, env_names: envnames.EnvNames) -> list[str]:
    """``status.members``: the group's live pods that :func:`listed_members` counts, pending ones included.

    The scheduler's placement write and the reconciler's writes both list them this way, so the status is
    right as soon as the placing pod is bound and no second write follows the placement."""
    return [p.name for p in listed_members(cluster.live_members(group.key), group.spec, env_names)]


def skipped_webhook(pods: list[state_.PodRecord], scheduler_name: str) -> list[state_.PodRecord]:
    """Members that name the group but not our scheduler: created without the webhook (the most common
    set-up mistake: the webhook not installed yet, or not running). Nobody will give them devices."""
    return [p for p in pods if p.scheduler_name != scheduler_name and not p.deleting]


def skipped_message(pods: list[state_.PodRecord], scheduler_name: str) -> str:
    shown = ", ".join(p.name for p in pods[:5]) + (f" and {len(pods) - 5} more" if len(pods) > 5 else "")
    return (
        f"pods {shown} name this group but were created without the deviceshare webhook (schedulerName is "
        f"{pods[0].scheduler_name!r}, not {scheduler_name!r}): check that the webhook runs and its "
        "MutatingWebhookConfiguration is installed, then delete and recreate the pods"
    )


# What happened to a group that holds nothing now: shown until something newer is known of it.
_TOLD_UNTIL_PLACED = ("Preempted", "NodeLost")


def scheduled(
    allocation: ledgers.Allocation | None, *, unschedulable: str | None = None, skipped: str | None = None,
    nominated: str | None = None, shown: models.GroupStatus | None = None,
) -> Scheduled:
    """Held devices say Bound; otherwise that a preemption makes room for it on ``nominated``, or the last
    reason it could not be placed (a gang short of members says ``WaitingForMembers``), or pods the webhook
    never saw (``skipped``), or what happened to it last (``shown``: it was preempted, its node was lost), or
    that it waits for its first pod."""
    if allocation is not None:
        return Scheduled("True", "Bound", f"placed on node {allocation.node} with {describe_allocation(allocation)}")
    if nominated is not None:
        return Scheduled("False", "Preempting", unschedulable or f"room is being made on node {nominated}")
    if unschedulable is not None:
        if reasonkinds.kind_of(unschedulable) == reasonkinds.GANG_WAITING:
            return Scheduled("False", gang.WAITING_FOR_MEMBERS, unschedulable)
        return Scheduled("False", "Unschedulable", unschedulable)
    if skipped is not None:
        return Scheduled("False", "PodsSkippedWebhook", skipped)
    last = next((c for c in shown.conditions if c.type == names.CONDITION_SCHEDULED), None) if shown else None
    if last is not None and last.reason in _TOLD_UNTIL_PLACED:
        return Scheduled(last.status, last.reason, last.message)
    return Scheduled("False", "WaitingForMembers",
                     "no member pod is waiting; the group is placed when its first pod is scheduled")


def bound(group: state_.GroupRecord, allocation: ledgers.Allocation, members: list[str]) -> StatusPatch:
    """A placement: Bound on the allocation's node, with its members (see :func:`member_names`)."""
    return {
        "phase": names.PHASE_BOUND,
        "members": members,
        "memberCount": len(members),
        "nodeName": allocation.node,
        "allocatedDevices": _devices(allocation),
        "allocatedTiles": _tiles(allocation),
        "observedGeneration": group.generation,
        "conditions": condition(
            wire_conditions(group.status.conditions), names.CONDITION_SCHEDULED, *scheduled(allocation),
            group.generation,
        ),
        "nominatedNodeName": None,
    }


def nominated(group: state_.GroupRecord, node: str, message: str) -> StatusPatch:
    """A preemption makes room for the group on ``node`` (CONTRACT §8): nominated, still Pending."""
    return {
        "nominatedNodeName": node,
        "conditions": condition(
            wire_conditions(group.status.conditions), names.CONDITION_SCHEDULED, "False", "Preempting", message,
            group.generation,
        ),
    }


def preempted(group: state_.GroupRecord, why: str) -> StatusPatch:
    """A victim whose members were evicted: devices released, Pending again (placed anew by its next pod)."""
    return {
        "phase": names.PHASE_PENDING,
        "nodeName": None,
        "allocatedDevices": None,
        "allocatedTiles": None,
        "conditions": condition(
            wire_conditions(group.status.conditions), names.CONDITION_SCHEDULED, "False", "Preempted", why,
            group.generation,
        ),
    }


def rolled_back(group: state_.GroupRecord | None, why: str) -> StatusPatch:
    """A placement undone before any of its pods was bound: Pending, no node, no devices."""
    return {
        "phase": names.PHASE_PENDING,
        "nodeName": None,
        "allocatedDevices": None,
        "allocatedTiles": None,
        "conditions": condition(
            wire_conditions(group.status.conditions) if group else [],
            names.CONDITION_SCHEDULED, "False", "RolledBack", why,
        ),
    }


def node_lost(group: state_.GroupRecord, why: str) -> StatusPatch:
    """The group's node is gone or NotReady and nothing ran there: devices released, Pending again."""
    conditions = condition(
        wire_conditions(group.status.conditions), names.CONDITION_NODE_LOST, "True", "NodeLost",
        f"{why}; no member was running there, so the devices were released and the group will be "
        "placed again", group.generation,
    )
    return {
        "phase": names.PHASE_PENDING,
        "nodeName": None,
        "allocatedDevices": None,
        "allocatedTiles": None,
        "conditions": condition(conditions, names.CONDITION_SCHEDULED, "False", "NodeLost", why, group.generation),
    }


def reconciled(
    group: state_.GroupRecord,
    allocation: ledgers.Allocation | None,
    *,
    phase: str | None,
    scheduled: Scheduled,
    node_lost: str | None,
    conflicting_with: Collection[state_.GroupKey],
    members: list[str],
    nominated: str | None = None,
    unhealthy: str | None = None,
) -> StatusPatch:
    """The whole status as the ledger and the pods say it should be. ``phase`` overrides Bound/Pending
    (Releasing); ``node_lost``: why the node that holds the devices is lost while a member still runs
    there; ``conflicting_with``: the other groups that claim some of its devices; ``unhealthy``: the held
    devices the node reports unhealthy (:func:`unhealthy_held`)."""
    gen = group.generation
    conds = condition(wire_conditions(group.status.conditions), names.CONDITION_SCHEDULED, *scheduled, gen)
    if node_lost:
        conds = condition(
            conds, names.CONDITION_NODE_LOST, "True", "NodeLost",
            f"{node_lost}; devices stay held while a member still runs there", gen,
        )
    else:
        conds = without_condition(conds, names.CONDITION_NODE_LOST)
    if conflicting_with:
        others = ", ".join(map(names.key_text, sorted(conflicting_with)))
        conds = condition(
            conds, names.CONDITION_CONFLICT, "True", "DevicesClaimedTwice",
            f"devices of this group are also claimed by {others}", gen,
        )
    else:
        conds = without_condition(conds, names.CONDITION_CONFLICT)
    if unhealthy:
        conds = condition(
            conds, names.CONDITION_DEVICE_UNHEALTHY, "True", "DeviceUnhealthy",
            f"{unhealthy}; the group keeps its devices and deviceshare evicts none of its pods: delete and "
            "recreate the group to be placed on healthy devices", gen,
        )
    else:
        conds = without_condition(conds, names.CONDITION_DEVICE_UNHEALTHY)
    return {
        "phase": phase or (names.PHASE_BOUND if allocation is not None else names.PHASE_PENDING),
        "nodeName": allocation.node if allocation else None,
        "allocatedDevices": _devices(allocation),
        "allocatedTiles": _tiles(allocation),
        "members": members,
        "memberCount": len(members),
        "observedGeneration": gen,
        "conditions": conds,
        "nominatedNodeName": None if allocation is not None else nominated,
    }


def unhealthy_held(allocation: ledgers.Allocation | None, node: inventory.NodeInfo | None) -> str | None:
    """``node gpu-3 reports nvidia.com/gpu GPU-1 unhealthy``: the devices the group holds that its node reports
    unhealthy (CONTRACT §9), or None."""
    if allocation is None or node is None or not node.unhealthy:
        return None
    sick = [
        f"{resource} {','.join(d for d in ids if d in node.unhealthy.get(resource, ()))}"
        for resource, ids in sorted(allocation.devices.items())
        if node.unhealthy.get(resource, frozenset()) & set(ids)
    ]
    return f"node {node.name} reports {'; '.join(sick)} unhealthy" if sick else None


def unchanged(current: models.GroupStatus, desired: StatusPatch) -> bool:
    """Whether writing ``desired`` (a :func:`reconciled` body) would change nothing a user could see."""
    return (
        current.phase == desired.get("phase")
        and current.node_name == desired.get("nodeName")
        and (current.allocated_devices or None) == desired.get("allocatedDevices")
        and (current.allocated_tiles or None) == desired.get("allocatedTiles")
        and current.members == desired.get("members")
        and current.member_count == desired.get("memberCount")
        and current.observed_generation == desired.get("observedGeneration")
        and current.nominated_node_name == desired.get("nominatedNodeName")
        and same_conditions(desired.get("conditions", []), wire_conditions(current.conditions))
    )


def _devices(allocation: ledgers.Allocation | None) -> dict[str, list[str]] | None:
    """``allocatedDevices`` (None removes it)."""
    if allocation is None:
        return None
    return {r: list(ids) for r, ids in sorted(allocation.devices.items())}


def _tiles(allocation: ledgers.Allocation | None) -> dict[str, list[str]] | None:
    """``allocatedTiles``, only for groups given tiles (None removes it)."""
    if allocation is None:
        return None
    return {r: list(ids) for r, ids in sorted(allocation.tiles.items())} or None
