"""What a node agent tells about a node's devices (CONTRACT §9), read from the node's annotations.

Three facts beside the inventory (:mod:`inventory`) and the capacity (:mod:`devicecapacity`): how the
devices are linked (``deviceshare.io/device-topology``, :mod:`topology`), which of them are unhealthy
(``deviceshare.io/device-health``), and whether an MPS control daemon serves them
(``deviceshare.io/mps: ready``). A value that cannot be read is a problem of the node, never an
exception: a health list nobody can read could hide a broken device, so the node then takes no new group.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from deviceshare.api import envnames, names
from deviceshare.core import topology as topologies


@dataclass(frozen=True, slots=True)
class NodeFacts:
    topology: Mapping[str, topologies.Topology] = field(default_factory=dict)  # resource -> links
    unhealthy: Mapping[str, frozenset[str]] = field(default_factory=dict)  # resource -> device IDs
    mps_ready: bool = False


NONE = NodeFacts()


def read(annotations: Mapping[str, Any], problems: list[str]) -> NodeFacts:
    """The agent's facts from a node's annotations; what cannot be read goes to ``problems``."""
    raw_topology = annotations.get(names.NODE_TOPOLOGY_ANNOTATION)
    raw_health = annotations.get(names.NODE_HEALTH_ANNOTATION)
    mps = annotations.get(names.NODE_MPS_ANNOTATION) == names.NODE_MPS_READY
    if raw_topology is None and raw_health is None and not mps:
        return NONE  # most nodes without an agent: nothing to parse
    topology: Mapping[str, topologies.Topology] = {}
    if raw_topology is not None:
        topology, error = topologies.parse(str(raw_topology))
        if error:
            problems.append(f"annotation {names.NODE_TOPOLOGY_ANNOTATION} {error}")
    unhealthy: dict[str, frozenset[str]] = {}
    if raw_health is not None:
        unhealthy, error = _health(str(raw_health))
        if error:
            problems.append(f"annotation {names.NODE_HEALTH_ANNOTATION} {error}")
    return NodeFacts(topology, unhealthy, mps)


def _health(raw: str) -> tuple[dict[str, frozenset[str]], str]:
    try:
        data = json.loads(raw)
    except ValueError as exc:
        return {}, f"is not valid JSON: {exc}"
    if not isinstance(data, dict):
        return {}, "must be a JSON object of resource -> list of unhealthy device IDs"
    out: dict[str, frozenset[str]] = {}
    for resource, ids in sorted(data.items()):
        if not envnames.is_device_resource(resource):
            return {}, f"names {resource!r}, which is not an extended resource (vendor.tld/name)"
        if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
            return {}, f"must list {resource} device IDs as non-empty strings"
        if ids:
            out[resource] = frozenset(ids)
    return out, ""


def health_annotation(unhealthy: Mapping[str, frozenset[str] | set[str] | list[str]]) -> str:
    """The annotation text for ``unhealthy`` (deterministic; resources with none left out)."""
    body = {r: sorted(ids) for r, ids in sorted(unhealthy.items()) if ids}
    return json.dumps(body, sort_keys=True, separators=(",", ":"))
