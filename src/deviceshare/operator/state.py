"""What the operator knows about pods and groups, distilled from watch events: their records (``records.py``)
by key, and which pods are members of which group. Nodes live in the core's DeviceLedger, not here.

A scheduling cycle reads a group here once per decision (:meth:`ClusterState.view`) and hands back what it
changed in one :class:`Changes` (:meth:`ClusterState.apply`), through ``cyclechanges.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping

from deviceshare.api import names
from deviceshare.core import priority as priority_

from . import tallies
from .records import (
    TERMINAL_PHASES,
    GroupKey,
    GroupRecord,
    PodKey,
    PodRecord,
    group_record,
    newer,
    parse_selected_devices,
    pod_record,
)

__all__ = [
    "TERMINAL_PHASES",
    "Changes",
    "ClusterState",
    "GroupKey",
    "GroupRecord",
    "GroupView",
    "PodKey",
    "PodRecord",
    "group_record",
    "newer",
    "parse_selected_devices",
    "pod_record",
]


@dataclasses.dataclass(frozen=True, slots=True)
class GroupView:
    """A group's members as one scheduling decision reads them (:meth:`ClusterState.view`), in one walk."""

    live: tuple[PodRecord, ...]  # member pods not finished, pending ones included, by key
    priority: int  # the group's priority (CONTRACT §8): the highest among ``live``
    running_others: int  # members on devices other than the pod the cycle schedules


@dataclasses.dataclass(slots=True)
class Changes:
    """What one scheduling cycle changed in these records, applied at once by :meth:`ClusterState.apply`, in
    this order: the API's answers about groups (``seen``), groups found gone, bindings about to be sent
    (``ahead``: pod, uid, group name), pods bound (``bound``: pod, node, annotations, group name), and bindings
    that certainly did not land (``forgotten``: pod, uid)."""

    seen: list[GroupRecord] = dataclasses.field(default_factory=list)
    gone: list[GroupKey] = dataclasses.field(default_factory=list)
    ahead: list[tuple[PodKey, str, str]] = dataclasses.field(default_factory=list)
    bound: list[tuple[PodRecord, str, Mapping[str, str], str]] = dataclasses.field(default_factory=list)
    forgotten: list[tuple[PodKey, str]] = dataclasses.field(default_factory=list)


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

    def view(self, group: GroupKey, pod: PodKey) -> GroupView:
        """``group``'s members as a scheduling decision about ``pod`` reads them: one walk of the members."""
        members = list(self.members(group))
        live = tuple(p for p in members if not p.terminated)
        running = sum(1 for p in members if p.on_devices and p.key != pod)
        return GroupView(live, priority_.group_priority([p.priority for p in live]), running)

    def apply(self, changes: Changes) -> None:
        """Make one cycle's ``changes`` so (see :class:`Changes` for the order), and empty them."""
        for group in changes.seen:
            self.upsert_group(group)
        for key in changes.gone:
            self.groups.pop(key, None)
        for pod_key, uid, name in changes.ahead:
            self.record_binding(pod_key, uid, name)
        for pod, node, written, name in changes.bound:
            self.assume(pod, node, written, name)
        for pod_key, uid in changes.forgotten:
            self.forget_binding(pod_key, uid)
        changes.seen, changes.gone, changes.ahead, changes.bound, changes.forgotten = [], [], [], [], []

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
        return priority_.group_priority([p.priority for p in self.members(group) if not p.terminated])

    def members_on_devices(self, group: GroupKey) -> list[PodRecord]:
        return [p for p in self.members(group) if p.on_devices]
