"""What the operator knows about pods and groups, distilled from watch events.

Only the fields scheduling and reconciliation need are kept (not whole bodies): at 10,000 pods the
difference is most of the operator's memory. Nodes live in the core's DeviceLedger, not here.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterator, Mapping
from operator import attrgetter
from typing import Any

import pydantic

from deviceshare.api import models, names
from deviceshare.core import inventory
from deviceshare.core import members as member_rules
from deviceshare.core import priority as priority_

from . import tallies

GroupKey = tuple[str, str]
PodKey = tuple[str, str]

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclasses.dataclass(frozen=True, slots=True)
class PodRecord:
    key: PodKey
    uid: str
    group: str | None  # the deviceshare.io/device-group annotation, verbatim (the tenant's to write)
    scheduler_name: str
    node_name: str | None
    phase: str
    deleting: bool
    resource_version: str
    selected_devices: str | None  # the raw annotation
    env_annotations: Mapping[str, str]  # env name -> value, from deviceshare.io/env.* annotations
    demand: inventory.PodDemand
    scheduled_condition: tuple[str, str, str] | None  # (status, reason, message) of PodScheduled
    # What the member rules read of its containers (the same ones the webhook applies at CREATE).
    containers: tuple[member_rules.ContainerFacts, ...] = ()
    group_valid: bool = False  # ``group`` is a well-formed group name (never used in a path otherwise)
    # spec.priority and spec.preemptionPolicy, as the API server's Priority admission set them (CONTRACT §8).
    priority: priority_.PodPriority = priority_.UNSET
    created: str = ""  # metadata.creationTimestamp: the queue's and a gang's order of arrival
    # The group we bound it into, by our own records (set by ClusterState, never read from the pod).
    member_of: str | None = None

    @property
    def group_key(self) -> GroupKey | None:
        """The group this pod belongs to as far as the operator is concerned.

        A pod we bound belongs to the group we bound it into, whatever its annotation says now; a pending
        pod to the group its annotation asks for (if well formed); a pod bound by anyone else to none.
        """
        if self.member_of is not None:
            return (self.key[0], self.member_of)
        if self.node_name or not self.group_valid or self.group is None:
            return None
        return (self.key[0], self.group)

    @property
    def terminated(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def on_devices(self) -> bool:
        """Bound and not finished: its containers may be using the group's devices right now."""
        return bool(self.node_name) and not self.terminated

    @property
    def name(self) -> str:
        return self.key[1]

    def joined(self, group: str) -> PodRecord:
        """This record as a member of ``group``: ``dataclasses.replace(self, member_of=group)`` without its
        per-field bookkeeping, at about half the cost (a rebuild makes one per bound pod)."""
        values = list(_pod_values(self))
        values[_MEMBER_OF] = group
        return PodRecord(*values)


_POD_FIELDS = tuple(f.name for f in dataclasses.fields(PodRecord))
_pod_values = attrgetter(*_POD_FIELDS)
_MEMBER_OF = _POD_FIELDS.index("member_of")


def pod_record(body: Mapping[str, Any]) -> PodRecord:
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    annotations = meta.get("annotations") or {}
    group = annotations.get(names.POD_GROUP_ANNOTATION)
    if group is not None:
        group = str(group)
    conditions = status.get("conditions")
    scheduled = next((c for c in conditions if c.get("type") == "PodScheduled"), None) if conditions else None
    return PodRecord(
        key=(meta.get("namespace", ""), meta.get("name", "")),
        uid=meta.get("uid", ""),
        group=group,
        scheduler_name=spec.get("schedulerName") or "default-scheduler",
        node_name=spec.get("nodeName") or None,
        phase=status.get("phase") or "Pending",
        deleting=bool(meta.get("deletionTimestamp")),
        resource_version=str(meta.get("resourceVersion", "")),
        selected_devices=annotations.get(names.POD_SELECTED_DEVICES_ANNOTATION),
        env_annotations=names.env_from_annotations(annotations),
        demand=_demand(body),
        scheduled_condition=(
            (scheduled.get("status", ""), scheduled.get("reason", ""), scheduled.get("message", ""))
            if scheduled else None
        ),
        containers=member_rules.container_facts(spec) if type(spec) is dict or isinstance(spec, Mapping) else (),
        group_valid=group is not None and member_rules.group_name_problem(group) is None,
        priority=priority_.of_pod(body),
        created=str(meta.get("creationTimestamp") or ""),
    )


def _demand(body: Mapping[str, Any]) -> inventory.PodDemand:
    try:
        return inventory.pod_demand(body)
    except ValueError:  # a quantity the API server would have refused: count it as nothing
        return inventory.PodDemand()


@dataclasses.dataclass(frozen=True, slots=True)
class GroupRecord:
    key: GroupKey
    uid: str
    generation: int
    resource_version: str
    spec: models.GroupSpec | None
    spec_error: str | None  # why the spec could not be used (the schema should have stopped it)
    status: models.GroupStatus
    deleting: bool
    finalizers: tuple[str, ...]
    created: str = ""  # metadata.creationTimestamp, as the API wrote it (time-to-bound is measured from it)

    @property
    def name(self) -> str:
        return self.key[1]


def group_record(body: Mapping[str, Any]) -> GroupRecord:
    meta = body.get("metadata") or {}
    spec: models.GroupSpec | None = None
    error: str | None = None
    try:
        spec = models.GroupSpec.model_validate(body.get("spec") or {})
    except pydantic.ValidationError as e:
        error = "; ".join(
            f"spec.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()
        )
    try:
        status = models.GroupStatus.from_k8s(body.get("status"))
    except pydantic.ValidationError:  # hand-edited beyond the schema: rebuilt by the reconciler
        status = models.GroupStatus()
    return GroupRecord(
        key=(meta.get("namespace", ""), meta.get("name", "")),
        uid=meta.get("uid", ""),
        generation=int(meta.get("generation") or 0),
        resource_version=str(meta.get("resourceVersion", "")),
        spec=spec,
        spec_error=error,
        status=status,
        deleting=bool(meta.get("deletionTimestamp")),
        finalizers=tuple(meta.get("finalizers") or ()),
        created=str(meta.get("creationTimestamp") or ""),
    )


def parse_selected_devices(raw: str | None) -> dict[str, list[str]] | None:
    """The deviceshare.io/selected-devices annotation -> resource -> IDs; None if absent or malformed."""
    parsed = _parse_selected_devices(raw)
    return None if parsed is None else {r: list(ids) for r, ids in parsed}


@functools.lru_cache(maxsize=8192)  # every member of a group carries the same string
def _parse_selected_devices(raw: str | None) -> tuple[tuple[str, tuple[str, ...]], ...] | None:
    parsed = _decode_selected_devices(raw)
    return None if parsed is None else tuple((r, tuple(ids)) for r, ids in parsed.items())


def _decode_selected_devices(raw: str | None) -> dict[str, list[str]] | None:
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    out: dict[str, list[str]] = {}
    for resource, ids in data.items():
        if not isinstance(ids, str):
            return None
        out[str(resource)] = [i for i in ids.split(",") if i]
    return out


def newer(new_rv: str, old_rv: str) -> bool:
    """Whether an event is at least as new as what we hold (resourceVersions compare as integers
    on every API server we know; if one is not an integer we cannot tell, and take the event)."""
    try:
        return int(new_rv) >= int(old_rv)
    except ValueError:
        return True


class ClusterState:
    """Pods and groups by key, with the group -> member pods index.

    Pods we bound are *assumed* on their node (kube-scheduler's term) until a watch event shows the
    binding, so an event that predates it cannot make a bound pod look pending again.

    Membership of a bound pod comes from our own records (:meth:`record_binding`: the bindings we made,
    and at a rebuild the members the groups' statuses record), never from its annotations, which the
    pod's owner can rewrite at any time: a member stays in its group whatever its annotation says later.
    """

    def __init__(self) -> None:
        self.pods: dict[PodKey, PodRecord] = {}
        # Counted by phase as it changes (the groups gauge reads the counts, never walks the groups).
        self.groups: tallies.Tally[GroupKey, GroupRecord] = tallies.Tally(lambda _, group: group.status.phase)
        self._members: dict[GroupKey, set[PodKey]] = {}
        self._assumed: dict[PodKey, PodRecord] = {}  # what we wrote, until a watch event shows the binding
        self._bound: dict[PodKey, tuple[str, str]] = {}  # pod -> (uid, group name) we bound it into

    def record_binding(self, key: PodKey, uid: str, group: str) -> None:
        """``key`` (with ``uid``) is a member of ``group`` in its namespace: we bound it there."""
        self._bound[key] = (uid, group)
        held = self.pods.get(key)
        if held is not None and held.uid == uid and held.member_of != group:
            self.upsert_pod(held)

    def forget_binding(self, key: PodKey, uid: str) -> None:
        """Undo :meth:`record_binding` for a Binding that certainly did not land."""
        record = self._bound.get(key)
        if record is None or record[0] != uid:
            return
        del self._bound[key]
        held = self.pods.get(key)
        if held is not None and held.uid == uid and held.member_of is not None and not held.node_name:
            self.upsert_pod(dataclasses.replace(held, member_of=None))

    def assume(self, pod: PodRecord, node: str, annotations: Mapping[str, str], group: str) -> PodRecord:
        """``pod`` was bound to ``node`` as a member of ``group``, with ``annotations``, by us just now."""
        bound = dataclasses.replace(
            pod,
            node_name=node,
            selected_devices=annotations.get(names.POD_SELECTED_DEVICES_ANNOTATION),
            env_annotations=names.env_from_annotations(annotations),
        )
        self._bound[pod.key] = (pod.uid, group)
        self.upsert_pod(bound)
        self._assumed[pod.key] = bound  # after the upsert, which clears assumptions it confirms
        return bound

    def upsert_group(self, group: GroupRecord) -> bool:
        """Store ``group`` unless we already hold a newer version of it. Returns whether stored."""
        old = self.groups.get(group.key)
        if old is not None and old.uid == group.uid and not newer(group.resource_version, old.resource_version):
            return False
        self.groups[group.key] = group
        return True

    def keep(self, group: GroupRecord) -> GroupRecord:
        """Write-through: keep the API's answer to our own read or write of a group (unless an event newer
        than that answer got here first) and hand it back to the caller, who acts on what the API said."""
        self.upsert_group(group)
        return group

    def upsert_pod(self, pod: PodRecord) -> PodRecord | None:
        record = self._bound.get(pod.key)
        if record is not None:
            if record[0] != pod.uid:
                del self._bound[pod.key]  # a new pod under the name: it is no one's member yet
            elif pod.member_of != record[1]:
                pod = pod.joined(record[1])
        assumed = self._assumed.get(pod.key)
        if assumed is not None:
            if assumed.uid != pod.uid or pod.node_name:
                del self._assumed[pod.key]
            else:  # an event from before our writes landed: keep what we know we wrote
                pod = dataclasses.replace(
                    pod,
                    node_name=assumed.node_name,
                    selected_devices=assumed.selected_devices,
                    env_annotations=assumed.env_annotations,
                )
        old = self.pods.get(pod.key)
        if old is not None and old.group_key != pod.group_key and old.group_key is not None:
            self._members.get(old.group_key, set()).discard(pod.key)
        self.pods[pod.key] = pod
        if pod.group_key is not None:
            self._members.setdefault(pod.group_key, set()).add(pod.key)
        return old

    def remove_pod(self, key: PodKey) -> PodRecord | None:
        self._assumed.pop(key, None)
        self._bound.pop(key, None)
        old = self.pods.pop(key, None)
        if old is not None and old.group_key is not None:
            members = self._members.get(old.group_key)
            if members is not None:
                members.discard(key)
                if not members:
                    del self._members[old.group_key]
        return old

    def members(self, group: GroupKey) -> Iterator[PodRecord]:
        for key in sorted(self._members.get(group, ())):
            yield self.pods[key]

    def live_members(self, group: GroupKey) -> list[PodRecord]:
        """Member pods not yet finished (pending ones included)."""
        return [p for p in self.members(group) if not p.terminated]

    def priority(self, group: GroupKey) -> int:
        """The group's priority: the highest ``spec.priority`` among its live member pods, 0 when none carries
        one (CONTRACT §8)."""
        return priority_.group_priority(p.priority for p in self.members(group) if not p.terminated)

    def members_on_devices(self, group: GroupKey) -> list[PodRecord]:
        return [p for p in self.members(group) if p.on_devices]
