"""The operator's records of pods and groups, made from their bodies: only the fields scheduling and
reconciliation read (at 150,000 pods the whole bodies would be most of the operator's memory).

Making them is the operator's most frequent work (every watch event, every object of a rebuild), so the parts that
many bodies share are made once: a pod's demand and member facts by the fields they are read from (a workload's
replicas, and every event of one pod, share them), a group's spec by the spec itself (bounded memos; pure, since
each key is what is read).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
from collections.abc import Mapping
from operator import attrgetter
from typing import Any

import orjson
import pydantic

from deviceshare.api import models, names
from deviceshare.core import inventory
from deviceshare.core import members as member_rules
from deviceshare.core import priority as priority_

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
    demand, containers = _shape(spec)
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
        demand=demand,
        scheduled_condition=(
            (scheduled.get("status", ""), scheduled.get("reason", ""), scheduled.get("message", ""))
            if scheduled else None
        ),
        containers=containers,
        group_valid=group is not None and _valid_group_name(group),
        priority=priority_.of_pod(body),
        created=str(meta.get("creationTimestamp") or ""),
    )


@functools.lru_cache(maxsize=8192)  # every member of a group names the same one
def _valid_group_name(group: str) -> bool:
    return member_rules.group_name_problem(group) is None


# What a pod's demand and member facts are read from: its containers and its node constraints.
_SHAPE = ("containers", "initContainers", "overhead", "nodeSelector", "tolerations", "affinity")
# By the JSON of those fields: the replicas of a workload, and every event of one pod, share them, so each
# distinct shape is read once (a bounded memo: pure, since the key is what is read).
_SHAPES: collections.OrderedDict[bytes, tuple[inventory.PodDemand, tuple[member_rules.ContainerFacts, ...]]] = (
    collections.OrderedDict()
)
_SHAPES_KEPT = 8192


def _shape(spec: Mapping[str, Any]) -> tuple[inventory.PodDemand, tuple[member_rules.ContainerFacts, ...]]:
    if type(spec) is not dict and not isinstance(spec, Mapping):
        return inventory.PodDemand(), ()
    try:
        # As the fields came (not sorted: sorting cost a fifth of a record): one server writes one shape's keys
        # in one order, and another order is only another key for the same facts.
        key = orjson.dumps([spec.get(f) for f in _SHAPE])
    except TypeError:  # not JSON (never from the API): read it afresh
        key = b""
    found = _SHAPES.get(key) if key else None
    if found is None:
        found = (_demand({"spec": spec}), member_rules.container_facts(spec))
        if key:
            _SHAPES[key] = found
            if len(_SHAPES) > _SHAPES_KEPT:
                _SHAPES.popitem(last=False)
    return found


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
    spec, error = _group_spec(body.get("spec") or {})
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


# Parsed specs by their JSON: a group's spec changes rarely (each status write and its watch event carry the
# same one) and many groups share one, so each distinct spec is validated once (a bounded memo: pure, since the
# key is the spec itself).
_SPECS: collections.OrderedDict[bytes, tuple[models.GroupSpec | None, str | None]] = collections.OrderedDict()
_SPECS_KEPT = 4096


def _group_spec(raw: Mapping[str, Any]) -> tuple[models.GroupSpec | None, str | None]:
    """The spec as the model, or why it cannot be used (the schema should have stopped it)."""
    try:
        key = orjson.dumps(raw, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # not JSON (never from the API): validate it afresh
        key = b""
    found = _SPECS.get(key) if key else None
    if found is not None:
        return found
    try:
        found = (models.GroupSpec.model_validate(raw), None)
    except pydantic.ValidationError as e:
        found = (None, "; ".join(f"spec.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()))
    if key:
        _SPECS[key] = found
        if len(_SPECS) > _SPECS_KEPT:
            _SPECS.popitem(last=False)
    return found


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
