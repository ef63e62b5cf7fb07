"""How much of each device a node offers to sharing groups: memory and tiles (CONTRACT §7).

Read from the node's annotations (``deviceshare.io/device-memory``, ``deviceshare.io/device-tiles``)
or the labels the vendors' feature discovery publishes (``nvidia.com/gpu.memory`` in MiB per GPU,
``gpu.intel.com/tiles`` summed over the node). Compute needs no declaration: it is 1 per device.
A value that cannot be read is a problem of the node, never an exception.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from deviceshare.api import envnames, names, quantities


def read(
    labels: Mapping[str, str],
    annotations: Mapping[str, Any],
    devices: Mapping[str, tuple[str, ...]],
    problems: list[str],
) -> tuple[dict[str, int], dict[str, int]]:
    """Memory (bytes) and tiles per device, by resource; what cannot be read goes to ``problems``.

    The annotations win over the vendors' labels: an admin who wrote one meant it.
    """
    memory: dict[str, int] = {}
    tiles: dict[str, int] = {}
    gfd = labels.get(names.NVIDIA_GPU_MEMORY_LABEL)
    if gfd is not None and names.NVIDIA_GPU_RESOURCE in devices:
        try:
            mib = int(gfd)
            if mib <= 0:
                raise ValueError
            memory[names.NVIDIA_GPU_RESOURCE] = mib * quantities.MIB
        except ValueError:
            problems.append(f"label {names.NVIDIA_GPU_MEMORY_LABEL}={gfd!r} is not a positive number of MiB")
    intel = labels.get(names.INTEL_TILES_LABEL)
    if intel is not None:
        for resource, ids in devices.items():
            if not resource.startswith(names.INTEL_RESOURCE_PREFIX) or not ids:
                continue
            try:
                total = int(intel)
            except ValueError:
                problems.append(f"label {names.INTEL_TILES_LABEL}={intel!r} is not a whole number of tiles")
                break
            if total <= 0 or total % len(ids):
                problems.append(
                    f"label {names.INTEL_TILES_LABEL}={intel!r} does not divide evenly over the node's "
                    f"{len(ids)} {resource} devices"
                )
                continue
            tiles[resource] = total // len(ids)
    for key, parse, into in (
        (names.NODE_DEVICE_MEMORY_ANNOTATION, _positive_bytes, memory),
        (names.NODE_DEVICE_TILES_ANNOTATION, _positive_int, tiles),
    ):
        raw = annotations.get(key)
        if raw is None:
            continue
        try:
            data = json.loads(str(raw))
        except ValueError as exc:
            problems.append(f"annotation {key} is not valid JSON: {exc}")
            continue
        if not isinstance(data, dict):
            problems.append(f"annotation {key} must be a JSON object of resource -> value per device")
            continue
        for resource, value in sorted(data.items()):
            if not envnames.is_device_resource(resource):
                problems.append(f"annotation {key} names {resource!r}, which is not an extended resource")
                continue
            try:
                into[resource] = parse(value)
            except ValueError as exc:
                problems.append(f"annotation {key}[{resource}]: {exc}")
    return memory, tiles


def _positive_bytes(value: object) -> int:
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    n = quantities.parse_bytes(value)
    if n <= 0:
        raise ValueError(f"device memory must be positive, got {value!r}")
    return n


def _positive_int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"tiles per device must be a positive integer, got {value!r}")
    return value
