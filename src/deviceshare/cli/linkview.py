"""How a group's devices are linked, as ``deviceshare inspect`` and ``explain`` show it (CONTRACT §9).

From the node's ``deviceshare.io/device-topology`` (what the node agent publishes) and the group's
``status.allocatedDevices``: the links among the devices it got, in ``nvidia-smi topo -m``'s words
(``NV4``, ``NV4 to SYS``) and their NUMA nodes. Kept apart so inspect.py stays about devices and tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from deviceshare.core import topology as topologies


def holders(devices: Sequence[Any]) -> dict[str, list[str]]:
    """Group ref -> the IDs it holds among ``devices`` (inspect's Device records), in inventory order."""
    out: dict[str, list[str]] = {}
    for device in devices:
        for holder in device.holders:
            out.setdefault(holder.ref, []).append(device.id)
    return out


def links(topology: topologies.Topology | None, ids: Sequence[str]) -> dict[str, Any]:
    """``{"links": "NV4", "numa": [0]}`` for a group's devices; empty without a topology or for one device."""
    if topology is None:
        return {}
    out: dict[str, Any] = {"numa": list(topologies.numa_of(topology, ids))}
    described = topologies.describe(topology, ids)
    if described:
        out["links"] = described
    return out


def line(ref: str, resource: str, ids: Sequence[str], topology: topologies.Topology | None) -> str:
    """``ml/trainer: nvidia.com/gpu 4 devices linked NV4 (NVLink), NUMA node 0``; "" when nothing is known."""
    facts = links(topology, ids)
    if not facts:
        return ""
    text = f"{ref}: {resource} {len(ids)} device{'s' if len(ids) != 1 else ''}"
    if "links" in facts:
        worst = facts["links"].split(" to ")[-1]
        text += f" linked {facts['links']} ({topologies.describe_worst(worst).partition(' (')[2].rstrip(')')})"
    numa = facts["numa"]
    return text + f", NUMA node{'s' if len(numa) != 1 else ''} {','.join(map(str, numa))}"


def group_links(
    node_topology: Mapping[str, topologies.Topology], allocated: Mapping[str, Sequence[str]]
) -> list[str]:
    """``nvidia.com/gpu: NV4 (NVLink)`` per resource of a group's allocation that the node describes."""
    out = []
    for resource, ids in sorted(allocated.items()):
        described = topologies.describe(node_topology.get(resource), list(ids))
        if described:
            worst = described.split(" to ")[-1]
            out.append(f"{resource} linked {described} (worst: {topologies.describe_worst(worst)})")
    return out
