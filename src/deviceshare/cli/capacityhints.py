"""What `deviceshare explain` says when a sharing group's share fits no device (CONTRACT §7).

How much each healthy device still offers to sharers, how a node declares the capacity shares are measured
against, and whether waiting can help at all: a share larger than any device is refused by every node even
when nobody else shares it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from deviceshare.api import names, quantities
from deviceshare.cli import inspect as inspect_

_CAPACITY = re.compile(r"^insufficient (?P<resource>\S+) (?P<what>compute|memory|tiles)$")
_UNDECLARED = re.compile(r"^no declared device (?P<what>memory|tiles) for (?P<resource>\S+)$")
_WITHHELD = re.compile(r"^node\(s\) had (?P<resource>\S+) devices tainted or allocated by another ResourceClaim$")


def withheld_hint(reason: str, count: int, devices: list[inspect_.NodeDevices]) -> str | None:
    """For a DRA group (CONTRACT §13) whose nodes would have room but for tainted devices or devices another
    ResourceClaim (not deviceshare's) holds: which ones, per node, as `inspect` shows them."""
    withheld = _WITHHELD.match(reason)
    if not withheld:
        return None
    resource = withheld.group("resource")
    per_node = []
    for n in devices:
        blocked = [f"{d.id} " + ("tainted" if d.tainted else f"claim {','.join(d.claims)}")
                   for d in n.resources.get(resource, ()) if d.tainted or (d.claims and not d.holders)]
        if blocked:
            per_node.append(f"{n.name} ({len(n.free(resource))} free; {', '.join(blocked)})")
    return (f"{count} node(s) would fit the group but for {resource} devices tainted NoSchedule/NoExecute or "
            f"allocated by a ResourceClaim deviceshare did not make: {'; '.join(per_node) or '?'}. Remove the "
            "device taint or free that claim; `deviceshare inspect` shows them.")


def capacity_hint(
    reason: str, count: int, spec: Mapping[str, Any], devices: list[inspect_.NodeDevices]
) -> str | None:
    """For a sharing group (CONTRACT §7): what each device still offers, or how a node declares capacity."""
    undeclared = _UNDECLARED.match(reason)
    if undeclared:
        resource, what = undeclared.group("resource"), undeclared.group("what")
        annotation = names.NODE_DEVICE_MEMORY_ANNOTATION if what == "memory" else names.NODE_DEVICE_TILES_ANNOTATION
        example = '"80Gi"' if what == "memory" else "2"
        label = names.NVIDIA_GPU_MEMORY_LABEL if what == "memory" else names.INTEL_TILES_LABEL
        return (f"{count} node(s) declare no device {what} for {resource}: kubectl annotate node NODE "
                f"{annotation}='{{\"{resource}\": {example}}}' (or run the vendor's feature discovery, "
                f"which labels {label}).")
    capacity = _CAPACITY.match(reason)
    if not capacity:
        return None
    resource, what = capacity.group("resource"), capacity.group("what")
    share = (spec.get("share") or {}).get(resource) or {}
    asked = ",".join(f"{k}={v}" for k, v in sorted(share.items())) or "?"
    usable = [(n, d) for n in devices if n.exists and n.shared
              for d in n.resources.get(resource, ()) if d.in_inventory and not d.unhealthy]
    left = [f"{n.name}/{d.id} " + (",".join(f"{k}={v}" for k, v in d.left().items()) if d.holders else "free")
            for n, d in usable if d.left() or not d.holders]
    said = (f"{count} node(s) have too little {what} left on their {resource} devices for a share of {asked} on "
            f"each of {(spec.get('resources') or {}).get(resource, '?')}; left per healthy device that takes "
            f"shares: {'; '.join(left) or 'none'}.")
    largest = _largest_device(what, [d for _, d in usable])
    if largest is not None and _asked(what, share) > largest[0]:
        return (f"{said} No device has that much {what} even when nobody shares it (the largest: {largest[1]}): "
                f"lower spec.share.{what}; waiting will not help.")
    return f"{said} Lower spec.share, or wait for a sharer to go."


def _asked(what: str, share: Mapping[str, Any]) -> int:
    """The share's ``memory`` in bytes or ``tiles`` in tiles (0 when absent or unreadable)."""
    try:
        return quantities.parse_bytes(share["memory"]) if what == "memory" else int(share.get("tiles") or 0)
    except (KeyError, ValueError, ArithmeticError):
        return 0


def _largest_device(what: str, devices: list[inspect_.Device]) -> tuple[int, str] | None:
    """The most memory (bytes) or tiles one of ``devices`` declares, and how to show it; None for compute (a
    whole device always has 1000m) or when no device declares the capacity."""
    if what == "memory":
        caps = [d.memory_cap for d in devices if d.memory_cap is not None]
        return (max(caps), quantities.format_bytes(max(caps))) if caps else None
    if what == "tiles":
        tiles = [d.tiles_cap for d in devices if d.tiles_cap]
        return (max(tiles), f"{max(tiles)} tiles") if tiles else None
    return None


