"""Why a group waits, as one of a few kinds: the ``reason`` label of ``deviceshare_unschedulable_groups``.

A group's unschedulable message counts every node's first failing reason (``0/12 nodes are available:
7 insufficient nvidia.com/gpu, 5 not in shared mode.``); a metric label must be bounded, so the message
is reduced to the kind of the reason that rejected the most nodes. Nodes not in shared mode never take
part and are passed over; a tie goes to the kind listed first in :data:`KINDS` (the kinds a user can act
on first). The strings come from :mod:`reasons` (and the quota refusal, CONTRACT §8's gang wait).
"""

from __future__ import annotations

import re
from typing import Final

from deviceshare.core import reasons

DEVICES: Final = "devices"
DEVICE_MEMORY: Final = "device_memory"
COMPUTE: Final = "compute"
TILES: Final = "tiles"
CPU: Final = "cpu"
MEMORY: Final = "memory"
SELECTOR: Final = "selector"
TAINTS: Final = "taints"
QUOTA: Final = "quota"
NOT_READY: Final = "not_ready"
GANG_WAITING: Final = "gang_waiting"
OTHER: Final = "other"
KINDS: Final = (DEVICES, DEVICE_MEMORY, COMPUTE, TILES, CPU, MEMORY, SELECTOR, TAINTS, QUOTA, NOT_READY,
                GANG_WAITING, OTHER)  # fmt: skip

QUOTA_MARK: Final = "over its device budget"  # in the operator's quota refusal (operator/quotas.py)
_COUNTED = re.compile(r"^0/\d+ nodes are available: (.*?)\.?$")
_GANG = re.compile(r"^\d+/\d+ member pods exist")
_GANG_WIDE = re.compile(r"^gang of \d+ member pods: ")  # gang.describe: no node fits the whole gang
_FIXED: Final = {
    reasons.INSUFFICIENT_CPU: CPU,
    reasons.INSUFFICIENT_MEMORY: MEMORY,
    reasons.NODE_AFFINITY: SELECTOR,
    reasons.GROUP_SELECTOR: SELECTOR,
    reasons.NOT_READY: NOT_READY,
    reasons.UNSCHEDULABLE: NOT_READY,
}


_TAINT = reasons.untolerated_taint("", "").split("{")[0]  # "node(s) had untolerated taint "
_NO_TILES = reasons.no_declared("", "tiles").removesuffix(" for ")
_NO_MEMORY = reasons.no_declared("", "memory").removesuffix(" for ")
_INSUFFICIENT = reasons.insufficient("")
_DRA = re.compile("(?:" + "|".join(re.escape(make("CLASS")).replace("CLASS", r"\S+") for make in (
    reasons.no_class_device, reasons.no_selected_device, reasons.withheld_devices)) + ")$")
_DIMENSIONS: Final = {"compute": COMPUTE, "memory": DEVICE_MEMORY, "tiles": TILES}


def reason_kind(reason: str) -> str:
    """The kind of one node's rejection reason (a :mod:`reasons` string)."""
    fixed = _FIXED.get(reason)
    if fixed is not None:
        return fixed
    if reason.startswith(_TAINT):
        return TAINTS
    if reason.startswith(_NO_TILES):
        return TILES
    if reason.startswith(_NO_MEMORY):
        return DEVICE_MEMORY
    if _DRA.match(reason):  # a DRA group's devices (CONTRACT §13)
        return DEVICES
    if reason.startswith(_INSUFFICIENT):  # "insufficient nvidia.com/gpu" or "... nvidia.com/gpu memory"
        _, _, dimension = reason[len(_INSUFFICIENT):].partition(" ")
        return _DIMENSIONS.get(dimension, DEVICES)
    return OTHER


def kind_of(message: str) -> str:
    """The kind of a group's unschedulable message (see the module doc)."""
    if QUOTA_MARK in message:
        return QUOTA
    if _GANG.match(message):
        return GANG_WAITING
    # The counts come first; what follows them (". preemption: ...", "Preempting ...") is another sentence.
    message = _GANG_WIDE.sub("", message).split(". ", 1)[0]
    counted = _COUNTED.match(message)
    if counted is None:
        return OTHER
    nodes: dict[str, int] = {}
    for part in re.split(r", (?=\d+ )", counted.group(1)):
        number, _, reason = part.partition(" ")
        if reason == reasons.NOT_SHARED or not number.isdigit():
            continue
        kind = reason_kind(reason)
        nodes[kind] = nodes.get(kind, 0) + int(number)
    if not nodes:
        return OTHER
    return min(nodes, key=lambda kind: (-nodes[kind], KINDS.index(kind)))
