"""The annotations a member pod carries: its group's devices, shares and tiles, in the mapping of env names the
operator was configured with (CONTRACT §7). Built once per allocation and kept, since every member's binding and
every reconcile asks for them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from deviceshare.api import envnames, podannotations
from deviceshare.core import inventory
from deviceshare.core import ledger as ledgers


def device_annotations(
    devices: Mapping[str, Sequence[str]],
    env_names: envnames.EnvNames,
    share: Mapping[str, podannotations.ShareAmounts] | None = None,
    tiles: Mapping[str, Sequence[str]] | None = None,
    node_devices: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, str]:
    """The annotations a member pod carries; see :func:`deviceshare.api.podannotations.member_annotations`."""
    return podannotations.member_annotations(devices, env_names, share, tiles, node_devices)


def allocation_annotations(
    allocation: ledgers.Allocation, env_names: envnames.EnvNames, node: inventory.NodeInfo | None
) -> dict[str, str]:
    """A member's annotations for its group's allocation, shares and tiles included (CONTRACT §7)."""
    kept = _ANNOTATIONS.get(allocation.group)
    if kept is not None and kept[0] is allocation and kept[1] is env_names and kept[2] is node:
        return dict(kept[3])  # the same allocation, mapping and node objects as last time: the same answer
    made = podannotations.member_annotations(
        allocation.devices, env_names, allocation.share, allocation.tiles, node.devices if node else None
    )
    _ANNOTATIONS[allocation.group] = (allocation, env_names, node, made)
    if len(_ANNOTATIONS) > 4096:
        del _ANNOTATIONS[next(iter(_ANNOTATIONS))]
    return dict(made)


# The last annotations made per group (every member's binding, every reconcile asks): immutable inputs, compared
# by identity, so a changed allocation or node is never answered from here.
_ANNOTATIONS: dict[tuple[str, str], tuple[object, object, object, dict[str, str]]] = {}
