"""Why a DRA group (CONTRACT §13) fits no node, said per node in DRA's terms.

The placement filters count a node short of devices as ``insufficient <DeviceClass>``, as for any resource.
For a DRA group that hides what an admin needs to know; a node counted so is told apart here, by what it
offers of the class: none at all (no slice of a driver the class selects), none its claim's selectors match,
enough but withheld (tainted ``NoSchedule``/``NoExecute``, or allocated by a claim deviceshare did not make),
or simply too few free (held by other groups). Only run when nothing fits: it asks every node again.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Set

from deviceshare.core import eligibility, inventory, placement, reasons
from deviceshare.core import ledger as ledgers


def refine(
    unschedulable: placement.Unschedulable,
    snapshot: ledgers.LedgerSnapshot,
    request: placement.GroupRequest,
    pod: inventory.PodDemand,
    excluded: Mapping[str, Set[str]] | None = None,
) -> placement.Unschedulable:
    """``unschedulable`` with each node counted as ``insufficient <class>`` told apart (see the module docstring).
    ``snapshot``: the ledger's, not narrowed; ``excluded``: node -> the devices the claim's selectors do not match
    (None: no selectors)."""
    if len(request.resources) != 1:
        return unschedulable
    ((device_class, need),) = request.resources.items()
    short = reasons.insufficient(device_class)
    if not unschedulable.reasons.get(short):
        return unschedulable
    counted = collections.Counter({r: n for r, n in unschedulable.reasons.items() if r != short})
    for state in snapshot.nodes.values():
        left_out = (excluded or {}).get(state.info.name, frozenset())
        narrowed = eligibility.narrow(state, device_class, left_out)
        if placement.node_failure(narrowed, request, pod) != short:
            continue
        offered = state.info.devices.get(device_class, ())
        offered = tuple(d for d in offered if d not in left_out)
        blocked = state.info.withheld.get(device_class, frozenset())
        if not state.info.devices.get(device_class):
            counted[reasons.no_class_device(device_class)] += 1
        elif not offered:  # (only with selectors: a node without any is counted above)
            counted[reasons.no_selected_device(device_class)] += 1
        elif len(narrowed.free.get(device_class, ())) + sum(d in blocked for d in offered) >= need:
            counted[reasons.withheld_devices(device_class)] += 1
        else:
            counted[short] += 1
    return placement.Unschedulable(dict(counted), unschedulable.total_nodes)
