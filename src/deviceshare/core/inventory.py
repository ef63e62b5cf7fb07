"""What a node offers and what a pod asks for, read from raw Kubernetes objects.

The operator hands us Node and Pod bodies as plain mappings; everything placement needs is
distilled here into small frozen records once, so the hot path never touches raw dicts.
Reading a node never raises: a malformed device annotation or quantity becomes a line in
``NodeInfo.problems`` and the node then offers no devices (CONTRACT §2).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from deviceshare.api import names, quantities
from deviceshare.core import devicecapacity, nodefacts
from deviceshare.core import topology as topologies

GroupKey = tuple[str, str]  # (namespace, name)
PodKey = tuple[str, str]  # (namespace, name)

_EMPTY: Mapping[str, str] = {}


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str  # NoSchedule | PreferNoSchedule | NoExecute


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str  # "" with operator Exists tolerates every taint
    operator: str  # Equal | Exists
    value: str
    effect: str  # "" matches every effect


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    labels: Mapping[str, str]
    shared: bool
    ready: bool
    unschedulable: bool
    taints: tuple[Taint, ...]
    devices: Mapping[str, tuple[str, ...]]  # resource -> device IDs in inventory order
    cpu_milli: int
    memory_bytes: int
    problems: tuple[str, ...] = ()
    # Per-device capacity for sharing groups (CONTRACT §7); a resource absent here declared none.
    device_memory: Mapping[str, int] = field(default_factory=dict)  # resource -> bytes per device
    device_tiles: Mapping[str, int] = field(default_factory=dict)  # resource -> tiles per device
    # What the node agent tells (CONTRACT §9): links between devices, devices that are unhealthy (never
    # free for a new group, see holdings.left_on), and whether an MPS control daemon serves the GPUs.
    topology: Mapping[str, topologies.Topology] = field(default_factory=dict)
    unhealthy: Mapping[str, frozenset[str]] = field(default_factory=dict)
    mps_ready: bool = False
    # Devices offered but given to no new group (Dynamic Resource Allocation, CONTRACT §13): tainted
    # NoSchedule/NoExecute, or in the allocation of a claim deviceshare did not make. Unlike ``unhealthy`` they
    # say nothing about a group already holding them.
    withheld: Mapping[str, frozenset[str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Requirement:
    """One matchExpressions / matchFields entry of a node selector term."""

    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist | Gt | Lt
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    """Expressions and fields are ANDed; terms of a pod are ORed."""

    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()


@dataclass(frozen=True, slots=True)
class PodDemand:
    cpu_milli: int = 0
    memory_bytes: int = 0
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    required_terms: tuple[NodeSelectorTerm, ...] = ()


# --- quantities ---------------------------------------------------------------------------------

_quantity = quantities.quantity


def parse_cpu(q: str | int | float) -> int:
    """CPU quantity in millicores, rounded up like the API server does ("100m", "2", "0.5")."""
    return quantities.parse_milli(q)


def parse_memory(q: str | int | float) -> int:
    """Memory quantity in bytes, rounded up ("512Mi", "1G", "1e9")."""
    return quantities.parse_bytes(q)


def _count(q: object) -> int:
    """A whole-number device count from status.allocatable."""
    if not isinstance(q, str | int | float):
        raise ValueError(f"not a quantity: {q!r}")
    value = _quantity(q)
    if value < 0 or value != value.to_integral_value():
        raise ValueError(f"not a whole number of devices: {q!r}")
    return int(value)


# --- nodes --------------------------------------------------------------------------------------


def is_device_resource(name: str) -> bool:
    """Extended resources (``vendor.tld/name``) outside the kubernetes.io namespaces."""
    if "/" not in name or name.startswith("requests."):
        return False
    domain = name.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def node_from_object(obj: Mapping[str, Any]) -> NodeInfo:
    """Distil a Node body; never raises, reports what it could not read in ``problems``."""
    meta = _mapping(obj.get("metadata"))
    spec = _mapping(obj.get("spec"))
    status = _mapping(obj.get("status"))
    labels = {str(k): str(v) for k, v in _mapping(meta.get("labels")).items()}
    annotations = _mapping(meta.get("annotations"))
    allocatable = _mapping(status.get("allocatable"))
    problems: list[str] = []

    devices: dict[str, tuple[str, ...]] = {}
    for resource, quantity in sorted(allocatable.items()):
        if not is_device_resource(str(resource)):
            continue
        try:
            devices[str(resource)] = tuple(str(i) for i in range(_count(quantity)))
        except ValueError as exc:
            problems.append(f"status.allocatable[{resource}]: {exc}")
    raw = annotations.get(names.NODE_DEVICES_ANNOTATION)
    if raw is not None:
        listed, error = _annotated_devices(raw)
        if error:
            problems.append(f"annotation {names.NODE_DEVICES_ANNOTATION} {error}")
        else:
            devices.update(listed)
    if problems:
        # Handing out "0".."N-1" when the admin listed UUIDs would name the wrong devices.
        devices = {}

    device_memory, device_tiles = devicecapacity.read(labels, annotations, devices, problems)
    facts = nodefacts.read(annotations, problems)

    cpu, memory = 0, 0
    try:
        cpu = parse_cpu(allocatable["cpu"]) if "cpu" in allocatable else 0
    except ValueError as exc:
        problems.append(f"status.allocatable[cpu]: {exc}")
    try:
        memory = parse_memory(allocatable["memory"]) if "memory" in allocatable else 0
    except ValueError as exc:
        problems.append(f"status.allocatable[memory]: {exc}")

    return NodeInfo(
        name=str(meta.get("name", "")),
        labels=labels,
        shared=labels.get(names.NODE_MODE_LABEL) == names.NODE_MODE_SHARED,
        ready=_ready(status),
        unschedulable=bool(spec.get("unschedulable", False)),
        taints=tuple(
            Taint(
                key=str(t.get("key", "")),
                value=str(t.get("value", "") or ""),
                effect=str(t.get("effect", "")),
            )
            for t in _list(spec.get("taints"))
            if isinstance(t, Mapping)
        ),
        devices=devices,
        cpu_milli=cpu,
        memory_bytes=memory,
        problems=tuple(problems),
        device_memory=device_memory,
        device_tiles=device_tiles,
        topology=facts.topology,
        unhealthy=facts.unhealthy,
        mps_ready=facts.mps_ready,
    )


def _annotated_devices(raw: object) -> tuple[dict[str, tuple[str, ...]], str]:
    """The explicit device IDs of the annotation, or an error text."""
    try:
        data = json.loads(str(raw))
    except ValueError as exc:
        return {}, f"is not valid JSON: {exc}"
    if not isinstance(data, dict):
        return {}, f"must be a JSON object of resource -> list of IDs, got {type(data).__name__}"
    result: dict[str, tuple[str, ...]] = {}
    for resource, ids in sorted(data.items()):
        if not is_device_resource(resource):
            return {}, f"names {resource!r}, which is not an extended resource (vendor.tld/name)"
        if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
            return {}, f"must list {resource} device IDs as non-empty strings"
        if len(set(ids)) != len(ids):
            return {}, f"lists a {resource} device ID twice"
        result[resource] = tuple(ids)
    return result, ""


def _ready(status: Mapping[str, Any]) -> bool:
    for cond in _list(status.get("conditions")):
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def _mapping(value: object) -> Mapping[str, Any]:
    # Bodies are dicts: the type check first spares the Mapping ABC's much slower isinstance (a rebuild
    # reads 10,000 pods, ten mappings each).
    return value if type(value) is dict or (value is not None and isinstance(value, Mapping)) else {}


def _list(value: object) -> Sequence[Any]:
    return value if isinstance(value, list | tuple) else ()


# --- pods ---------------------------------------------------------------------------------------


def pod_demand(pod: Mapping[str, Any]) -> PodDemand:
    """What the scheduler must find room for; ValueError on a quantity the API would reject.

    The effective request is kube-scheduler's: the larger of the app containers (plus restartable
    init "sidecar" containers) and the largest regular init container (plus the sidecars started
    before it), plus the pod overhead.
    """
    spec = _mapping(pod.get("spec"))
    cpu, memory = _effective_requests(spec)
    if not (spec.get("nodeSelector") or spec.get("tolerations") or spec.get("affinity")):
        return PodDemand(cpu, memory)  # most pods: no node constraints to read
    affinity = _mapping(_mapping(spec.get("affinity")).get("nodeAffinity"))
    required = _mapping(affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    return PodDemand(
        cpu_milli=cpu,
        memory_bytes=memory,
        node_selector={str(k): str(v) for k, v in _mapping(spec.get("nodeSelector")).items()},
        tolerations=tuple(
            Toleration(
                key=str(t.get("key", "") or ""),
                operator=str(t.get("operator", "") or "Equal"),
                value=str(t.get("value", "") or ""),
                effect=str(t.get("effect", "") or ""),
            )
            for t in _list(spec.get("tolerations"))
            if isinstance(t, Mapping)
        ),
        required_terms=tuple(
            _term(t) for t in _list(required.get("nodeSelectorTerms")) if isinstance(t, Mapping)
        ),
    )


def _term(raw: Mapping[str, Any]) -> NodeSelectorTerm:
    def reqs(items: object) -> tuple[Requirement, ...]:
        return tuple(
            Requirement(
                key=str(r.get("key", "")),
                operator=str(r.get("operator", "")),
                values=tuple(str(v) for v in _list(r.get("values"))),
            )
            for r in _list(items)
            if isinstance(r, Mapping)
        )

    return NodeSelectorTerm(
        expressions=reqs(raw.get("matchExpressions")), fields=reqs(raw.get("matchFields"))
    )


def _requests(container: object) -> tuple[int, int]:
    resources = _mapping(_mapping(container).get("resources"))
    # The API server copies limits into missing requests; do the same for bodies that skipped it.
    merged = {**_mapping(resources.get("limits")), **_mapping(resources.get("requests"))}
    cpu = parse_cpu(merged["cpu"]) if "cpu" in merged else 0
    memory = parse_memory(merged["memory"]) if "memory" in merged else 0
    return cpu, memory


def _effective_requests(spec: Mapping[str, Any]) -> tuple[int, int]:
    app_cpu = app_mem = 0
    for c in _list(spec.get("containers")):
        cpu, mem = _requests(c)
        app_cpu, app_mem = app_cpu + cpu, app_mem + mem
    side_cpu = side_mem = init_cpu = init_mem = 0
    for c in _list(spec.get("initContainers")):
        cpu, mem = _requests(c)
        if _mapping(c).get("restartPolicy") == "Always":
            side_cpu, side_mem = side_cpu + cpu, side_mem + mem
        else:
            init_cpu, init_mem = max(init_cpu, side_cpu + cpu), max(init_mem, side_mem + mem)
    overhead = _mapping(spec.get("overhead"))
    over_cpu = parse_cpu(overhead["cpu"]) if "cpu" in overhead else 0
    over_mem = parse_memory(overhead["memory"]) if "memory" in overhead else 0
    return (
        max(app_cpu + side_cpu, init_cpu) + over_cpu,
        max(app_mem + side_mem, init_mem) + over_mem,
    )
