"""Claims on devices as the API shows them, for rebuilding the ledger after a restart or failover.

A group's status is the primary record (it is written before any pod learns its devices); member pods'
``selected-devices`` annotations are a second witness. Both become claims; the ledger decides what
conflicts, and reports rather than picks.
"""

from __future__ import annotations

from collections.abc import Iterable

from deviceshare.api import names
from deviceshare.core import capacity
from deviceshare.core import ledger as ledgers

from . import state as state_


def claims(
    groups: Iterable[state_.GroupRecord], pods: Iterable[state_.PodRecord]
) -> list[ledgers.Claim]:
    out: list[ledgers.Claim] = []
    groups = list(groups)
    # A sharing group's share is read back from its spec (immutable once Bound, CEL-enforced).
    shares = {g.key: capacity.shares_from_spec(g.spec.share) for g in groups if g.spec is not None and g.spec.share}
    for g in groups:
        st = g.status
        if st.phase in (names.PHASE_BOUND, names.PHASE_RELEASING) and st.node_name and st.allocated_devices:
            out.append(
                ledgers.Claim(
                    group=g.key,
                    node=st.node_name,
                    devices={r: tuple(ids) for r, ids in st.allocated_devices.items()},
                    source=f"status of {g.key[0]}/{g.key[1]}",
                    share=shares.get(g.key, {}),
                    tiles={r: tuple(ids) for r, ids in st.allocated_tiles.items()},
                )
            )
    for p in pods:
        if not p.on_devices or p.group_key is None:
            continue
        devices = state_.parse_selected_devices(p.selected_devices)
        if devices and p.node_name:
            out.append(
                ledgers.Claim(
                    group=p.group_key,
                    node=p.node_name,
                    devices={r: tuple(ids) for r, ids in devices.items()},
                    source=f"pod {p.key[0]}/{p.key[1]}",
                    share=shares.get(p.group_key, {}),
                )
            )
    return out
