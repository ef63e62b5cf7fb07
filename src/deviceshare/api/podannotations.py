"""What a member pod is given before binding: its device annotations, as one pure function.

:func:`member_annotations` is the single place that turns a group's allocation into the pod
annotations of CONTRACT §3 and §7; the operator writes them (in the pod patch or the Binding) and
the webhook wires each ``deviceshare.io/env.<NAME>`` into the containers through the downward API
(:meth:`envnames.EnvNames.for_group` lists the names). Ordinals are as the container sees them:

- MPS/HAMi-core limits count the group's devices from 0 in the order the visibility variable lists
  them (``NVIDIA_VISIBLE_DEVICES=2,3`` shows the container devices 0 and 1);
- tiles go to ``ZE_AFFINITY_MASK``, which is itself the selector, so a card's ordinal is its place
  in the node's inventory (``node_devices``; without it a numeric device ID is taken as the ordinal).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Protocol

from deviceshare.api import envnames, names, quantities


class ShareAmounts(Protocol):
    """A share as :class:`models.DeviceShare` or the core's ``capacity.Share`` expose it."""

    @property
    def compute_milli(self) -> int: ...

    @property
    def memory_bytes(self) -> int: ...


def mps_percentage(compute_milli: int) -> int:
    """``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: ceil(compute x 100), at least 1."""
    return max(1, math.ceil(compute_milli / 10))


def memory_limit(ordinals: Sequence[int], memory_bytes: int, fmt: envnames.MemoryFormat) -> str:
    """``0=12288M,1=12288M`` (MPS, MiB per device ordinal) or ``12288m`` (HAMi-core, every device)."""
    mib = memory_bytes // quantities.MIB  # rounded down: a limit never promises more than was reserved
    if fmt == "hami":
        return f"{mib}m"
    return ",".join(f"{i}={mib}M" for i in ordinals)


def tile_mask(
    tiles: Sequence[str], devices: Sequence[str], node_devices: Sequence[str] | None = None
) -> list[str]:
    """``<ordinal>.<tile>`` entries of ``ZE_AFFINITY_MASK`` for tiles named ``<device-id>.<tile>``."""
    position = {d: i for i, d in enumerate(node_devices)} if node_devices else {}
    out = []
    for tile_id in tiles:
        device, _, tile = str(tile_id).rpartition(".")
        if device in position:
            ordinal = position[device]
        elif device.isdigit():
            ordinal = int(device)
        else:
            ordinal = list(devices).index(device) if device in devices else 0
        out.append(f"{ordinal}.{tile}")
    return out


def member_annotations(
    devices: Mapping[str, Sequence[str]],
    env_names: envnames.EnvNames,
    share: Mapping[str, ShareAmounts] | None = None,
    tiles: Mapping[str, Sequence[str]] | None = None,
    node_devices: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, str]:
    """The annotations a member pod carries (CONTRACT §3, §7), from its group's allocation.

    ``devices``: resource -> device IDs; ``share``: resource -> the share (absent: whole devices);
    ``tiles``: resource -> ``<device-id>.<tile>`` of a tile share; ``node_devices``: resource -> the
    node's device IDs in inventory order (tile ordinals). Where several resources feed one variable,
    their values are joined in resource order; a limit variable takes the first resource's value.
    """
    share, tiles = share or {}, tiles or {}
    selected = {r: ",".join(ids) for r, ids in sorted(devices.items())}
    out = {names.POD_SELECTED_DEVICES_ANNOTATION: json.dumps(selected, separators=(",", ":"))}
    per_env: dict[str, list[str]] = {}
    limits: dict[str, str] = {}
    for resource, ids in sorted(devices.items()):
        visible = env_names.for_resource(resource)
        mask = tile_mask(tiles[resource], ids, (node_devices or {}).get(resource)) if tiles.get(resource) else None
        first = len(per_env.get(visible[0], ())) if visible else 0  # where this resource's ordinals start
        for env in visible:
            per_env.setdefault(env, []).extend(mask if mask is not None and env == envnames.TILE_ENV_NAME else ids)
        if mask is not None and envnames.TILE_ENV_NAME not in visible:
            per_env.setdefault(envnames.TILE_ENV_NAME, []).extend(mask)
        amounts = share.get(resource)
        names_ = env_names.limits_for(resource)
        if amounts is None or names_ is None or mask is not None:
            continue
        if amounts.compute_milli and names_.compute:
            limits.setdefault(names_.compute, str(mps_percentage(amounts.compute_milli)))
        if amounts.memory_bytes and names_.memory:
            ordinals = range(first, first + len(ids))
            limits.setdefault(names_.memory, memory_limit(ordinals, amounts.memory_bytes, names_.memory_format))
    for env, values in per_env.items():
        out[names.env_annotation(env)] = ",".join(values)
    for env, value in limits.items():
        out[names.env_annotation(env)] = value
    return out
