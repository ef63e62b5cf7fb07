"""What the node agent read from the driver (or a file), and the annotations that say it (CONTRACT §9).

Pure: a :class:`NodeReading` in, the five annotation values out, byte for byte the same for the same facts,
so "did anything change?" is a comparison of strings and an unchanged node is never written. A value of
``None`` means the annotation should be absent (no unhealthy device, no MPS daemon).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from deviceshare.api import names, quantities
from deviceshare.core import nodefacts

# The annotations the agent owns; it writes these and no other part of the Node.
OWNED = (
    names.NODE_DEVICES_ANNOTATION,
    names.NODE_DEVICE_MEMORY_ANNOTATION,
    names.NODE_TOPOLOGY_ANNOTATION,
    names.NODE_HEALTH_ANNOTATION,
    names.NODE_MPS_ANNOTATION,
)

Annotations = dict[str, str | None]  # annotation -> value; None: absent


@dataclass(frozen=True, slots=True)
class ResourceReading:
    """One device resource on the node: its device IDs in the driver's order and what is known of them."""

    devices: tuple[str, ...]
    memory_bytes: int | None = None  # per device (the smallest, if they differ); None: not known
    links: Mapping[tuple[str, str], str] = field(default_factory=dict)  # (a, b) -> NV12 / PIX / ... / SYS
    numa: Mapping[str, int] = field(default_factory=dict)
    unhealthy: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class NodeReading:
    resources: Mapping[str, ResourceReading]
    mps_ready: bool = False


def to_annotations(reading: NodeReading) -> Annotations:
    """The five annotation values that state ``reading`` (deterministic JSON, sorted keys, no spaces)."""
    res = dict(sorted(reading.resources.items()))
    devices = {r: list(x.devices) for r, x in res.items()}
    memory = {r: f"{x.memory_bytes // quantities.MIB}Mi" for r, x in res.items() if x.memory_bytes}
    linked = {r: _topology(x) for r, x in res.items() if x.links or x.numa}
    unhealthy = {r: x.unhealthy & set(x.devices) for r, x in res.items()}
    return {
        names.NODE_DEVICES_ANNOTATION: _json(devices) if devices else None,
        names.NODE_DEVICE_MEMORY_ANNOTATION: _json(memory) if memory else None,
        names.NODE_TOPOLOGY_ANNOTATION: _json(linked) if linked else None,
        names.NODE_HEALTH_ANNOTATION: nodefacts.health_annotation(unhealthy) if any(unhealthy.values()) else None,
        names.NODE_MPS_ANNOTATION: names.NODE_MPS_READY if reading.mps_ready else None,
    }


def published(node_annotations: Mapping[str, str] | None) -> Annotations:
    """What a Node carries now of the annotations the agent owns (absent ones as None)."""
    have = node_annotations or {}
    return {key: have.get(key) for key in OWNED}


def changes(current: Annotations, desired: Annotations) -> Annotations:
    """The merge-patch body's annotations: only those that differ (None removes one)."""
    return {k: v for k, v in desired.items() if current.get(k) != v}


def _topology(read: ResourceReading) -> dict[str, dict[str, object]]:
    """One resource's part of ``deviceshare.io/device-topology``: each device's NUMA node and its links,
    both ways (the form :func:`deviceshare.core.topology.annotation` writes)."""
    rows: dict[str, dict[str, str]] = {d: {} for d in read.devices}
    for (a, b), link in read.links.items():
        if a in rows and b in rows and a != b:
            rows[a][b] = rows[b][a] = link
    return {d: {"links": rows[d], "numa": read.numa.get(d, -1)} for d in read.devices}


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
