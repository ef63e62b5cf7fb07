"""Devices described in a JSON file: Intel and the other vendors, MIG devices, or anything NVML does not see.

The admin, or another agent (Intel's XPU manager exporter, a vendor script), writes the file; the node
agent reads it on every poll and publishes the same annotations as for NVML (CONTRACT §9)::

    {
      "resources": {
        "gpu.intel.com/i915": {
          "devices": ["card0", "card1"],          # required: the IDs the containers are given
          "memory": "48Gi",                      # optional: per device
          "numa": {"card0": 0, "card1": 1},      # optional
          "links": {"card0": {"card1": "SYS"}},  # optional: nvidia-smi's words, NV<n> PIX PXB PHB NODE SYS
          "unhealthy": ["card1"]                 # optional
        }
      },
      "mps": "ready"                              # optional
    }

A file that cannot be read or does not say this is a :class:`FileSourceError` naming the file and the
field, and nothing is published from it until it is fixed (the last good annotations stay).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from deviceshare.api import envnames, names, quantities
from deviceshare.core import topology as topologies
from deviceshare.nodeagent import readings


class FileSourceError(ValueError):
    """The device file is missing or says something the agent cannot publish."""


class FileSource:
    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> readings.NodeReading:
        try:
            data = json.loads(self.path.read_text())
        except OSError as e:
            raise FileSourceError(f"cannot read device file {self.path}: {e.strerror or e}") from e
        except ValueError as e:
            raise FileSourceError(f"device file {self.path} is not valid JSON: {e}") from e
        return parse(data, str(self.path))


def parse(data: Any, where: str = "device file") -> readings.NodeReading:
    if not isinstance(data, dict) or not isinstance(data.get("resources"), dict):
        raise FileSourceError(f"{where}: expected an object with \"resources\": {{resource: {{\"devices\": [...]}}}}")
    unknown = set(data) - {"resources", "mps"}
    if unknown:
        raise FileSourceError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    mps = data.get("mps")
    if mps not in (None, names.NODE_MPS_READY):
        raise FileSourceError(f"{where}: \"mps\" may only be \"{names.NODE_MPS_READY}\" (or absent), got {mps!r}")
    resources = {r: _resource(f"{where}: resources[{r}]", r, v) for r, v in sorted(data["resources"].items())}
    return readings.NodeReading(resources, mps_ready=mps == names.NODE_MPS_READY)


def _resource(where: str, resource: str, body: Any) -> readings.ResourceReading:
    if not envnames.is_device_resource(resource):
        raise FileSourceError(f"{where}: not an extended resource name (vendor.tld/name)")
    if not isinstance(body, dict):
        raise FileSourceError(f"{where}: expected an object with \"devices\"")
    unknown = set(body) - {"devices", "memory", "numa", "links", "unhealthy"}
    if unknown:
        raise FileSourceError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    devices = body.get("devices")
    if not isinstance(devices, list) or not all(isinstance(d, str) and d for d in devices):
        raise FileSourceError(f"{where}.devices: expected a list of non-empty device IDs")
    if len(set(devices)) != len(devices):
        raise FileSourceError(f"{where}.devices: lists a device twice")
    listed = set(devices)
    memory = None
    if "memory" in body:
        try:
            memory = quantities.parse_bytes(body["memory"])
        except (ValueError, TypeError) as e:
            raise FileSourceError(f"{where}.memory: {e}") from e
        if memory <= 0:
            raise FileSourceError(f"{where}.memory: must be positive")
    numa = _mapping(where, "numa", body, listed)
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in numa.values()):
        raise FileSourceError(f"{where}.numa: NUMA nodes are integers")
    links: dict[tuple[str, str], str] = {}
    for device, row in _mapping(where, "links", body, listed).items():
        if not isinstance(row, dict):
            raise FileSourceError(f"{where}.links[{device}]: expected an object of other device -> link")
        for other, link in row.items():
            if other not in listed or other == device:
                raise FileSourceError(f"{where}.links[{device}]: {other!r} is no other listed device")
            if not topologies.is_link(link):
                raise FileSourceError(f"{where}.links[{device}][{other}]: {link!r} is not NV<n>, PIX, PXB, PHB, "
                                      "NODE or SYS")
            links[(device, other)] = link
    unhealthy = body.get("unhealthy", [])
    if not isinstance(unhealthy, list) or not set(unhealthy) <= listed:
        raise FileSourceError(f"{where}.unhealthy: expected a list of listed devices")
    return readings.ResourceReading(tuple(devices), memory, links, numa, frozenset(unhealthy))


def _mapping(where: str, key: str, body: Mapping[str, Any], listed: set[str]) -> dict[str, Any]:
    value = body.get(key, {})
    if not isinstance(value, dict):
        raise FileSourceError(f"{where}.{key}: expected an object keyed by device ID")
    strays = set(value) - listed
    if strays:
        raise FileSourceError(f"{where}.{key}: names unlisted device(s) {', '.join(sorted(strays))}")
    return dict(value)
