"""Claims on devices as the API shows them, for rebuilding the ledger after a restart or failover.

Only records the operator wrote count. A group's status is the primary record: it is written before any
pod learns its devices, through the status subresource, which tenants' roles do not grant. A pod's
annotations are the tenant's to write (unless the admission policy of ``manifests/base`` is installed),
so a pod's ``selected-devices`` counts only where it agrees with a record of ours:

- its group's status is Bound on the pod's node and lists the pod among its ``members``, or claims
  exactly the devices the pod names: the pod is a member we bound (recorded as such, so its group's
  devices stay held while it runs, whatever its annotations say);
- its group is gone (someone removed our finalizer while it ran) and the pod uses our scheduler: we
  bound it, as far as the API can tell us. With the policy installed only the operator can have written
  its ``selected-devices``; without it the claim could be forged, so it never counts against a device a
  group's status holds: at worst it keeps free devices, on the node the pod already runs on, held until
  the pod ends.

Anything else (a pod outside deviceshare with ``spec.nodeName`` and a forged ``selected-devices``, a pod
whose group's status does not agree) is an *untrusted* claim: reported (event and metric), never a
conflict that freezes the group really holding the devices.

After a rebuild, :func:`announce` says what it found (events, metrics, log lines); ``Runtime.rebuild`` runs it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

from deviceshare.api import names
from deviceshare.core import capacity
from deviceshare.core import claims as claims_
from deviceshare.core import ledger as ledgers

from . import state as state_
from .context import Context

logger = logging.getLogger(__name__)

_HOLDING = (names.PHASE_BOUND, names.PHASE_RELEASING)


@dataclasses.dataclass(frozen=True)
class Untrusted:
    pod: state_.PodRecord
    why: str


@dataclasses.dataclass(frozen=True)
class Claims:
    claims: list[ledgers.Claim]
    # Pods we bound, as the API records it: pod -> (uid, group name in the pod's namespace).
    members: dict[state_.PodKey, tuple[str, str]]
    untrusted: list[Untrusted]


def sort_claims(
    groups: Iterable[state_.GroupRecord], pods: Iterable[state_.PodRecord], scheduler_name: str
) -> Claims:
    out: list[ledgers.Claim] = []
    held: set[tuple[str, str, str]] = set()  # (node, resource, device) a group's status holds
    holding: dict[state_.GroupKey, state_.GroupRecord] = {}
    listed: dict[state_.PodKey, list[state_.GroupKey]] = {}  # pod -> groups whose status lists it
    known: set[state_.GroupKey] = set()
    for g in groups:
        known.add(g.key)
        st = g.status
        if st.phase in _HOLDING and st.node_name and st.allocated_devices:
            holding[g.key] = g
            out.append(
                ledgers.Claim(
                    group=g.key,
                    node=st.node_name,
                    devices={r: tuple(ids) for r, ids in st.allocated_devices.items()},
                    source=f"status of {names.key_text(g.key)}",
                    # A sharing group's share is read back from its spec (immutable once Bound, CEL-enforced).
                    share=capacity.shares_from_spec(g.spec.share) if g.spec is not None else {},
                    tiles={r: tuple(ids) for r, ids in st.allocated_tiles.items()},
                )
            )
            held.update((st.node_name, r, d) for r, ids in st.allocated_devices.items() for d in ids)
            for member in st.members:
                listed.setdefault((g.key[0], member), []).append(g.key)

    members: dict[state_.PodKey, tuple[str, str]] = {}
    untrusted: list[Untrusted] = []
    gone: list[tuple[state_.PodRecord, str, dict[str, list[str]]]] = []
    for p in pods:
        if not p.on_devices or not p.node_name:
            continue
        devices = state_.parse_selected_devices(p.selected_devices)
        ours = p.scheduler_name == scheduler_name
        recorded = _recorded_group(p, devices, holding, listed) if ours else None
        if recorded is not None:
            members[p.key] = (p.uid, recorded[1])
            continue
        if not devices:
            continue  # claims nothing
        if ours and p.group_valid and p.group is not None and (p.key[0], p.group) not in known:
            gone.append((p, p.group, devices))
        elif not ours:
            untrusted.append(Untrusted(p, f"it is not scheduled by {scheduler_name}"))
        elif p.group is None or not p.group_valid:
            untrusted.append(Untrusted(p, "it names no valid SharedDeviceGroup"))
        else:
            untrusted.append(Untrusted(p, f'the status of SharedDeviceGroup "{p.group}" does not record it '
                                          f"on node {p.node_name}"))

    for p, group, devices in gone:
        taken = sorted(f"{r} {d}" for r, ids in devices.items() for d in ids if (p.node_name, r, d) in held)
        if taken:
            untrusted.append(Untrusted(
                p, f'its group "{group}" is gone and {", ".join(taken)} on node {p.node_name} '
                   "belong to a group whose status holds them"))
            continue
        members[p.key] = (p.uid, group)
        out.append(
            ledgers.Claim(
                group=(p.key[0], group),
                node=str(p.node_name),
                devices={r: tuple(ids) for r, ids in devices.items()},
                source=f"pod {names.key_text(p.key)}",
            )
        )
    return Claims(out, members, untrusted)


def _recorded_group(
    pod: state_.PodRecord,
    devices: dict[str, list[str]] | None,
    holding: dict[state_.GroupKey, state_.GroupRecord],
    listed: dict[state_.PodKey, list[state_.GroupKey]],
) -> state_.GroupKey | None:
    """The group whose status shows ``pod`` as a member on its node: listed among its members, or (a member
    bound just before a crash, before the status listed it) naming the group and exactly its devices."""
    for gkey in listed.get(pod.key, ()):
        if holding[gkey].status.node_name == pod.node_name:
            return gkey
    if pod.group is None or not pod.group_valid or devices is None:
        return None
    group = holding.get((pod.key[0], pod.group))
    if group is None or group.status.node_name != pod.node_name:
        return None
    recorded = {r: sorted(ids) for r, ids in (group.status.allocated_devices or {}).items()}
    return group.key if recorded == {r: sorted(ids) for r, ids in devices.items()} else None


def contested(report: ledgers.RebuildReport) -> dict[state_.GroupKey, set[state_.GroupKey]]:
    """Each group whose devices another group also claims -> those other groups."""
    out: dict[state_.GroupKey, set[state_.GroupKey]] = {}
    for c in report.conflicts:
        for g in c.groups:
            out.setdefault(g, set()).update(o for o in c.groups if o != g)
    return out


def announce(ctx: Context, report: ledgers.RebuildReport, untrusted: Iterable[Untrusted]) -> None:
    """Tell the groups' and pods' owners (events), the metrics and the log what the rebuild found wrong."""
    state = ctx.state
    for c in report.conflicts:
        ctx.metrics.device_conflicts.inc()
        # Over-commitment and mixed kinds are reported, as double holding is: nobody is evicted.
        logger.error("device %s=%s on node %s %s: %s", c.resource, c.device, c.node, c.reason,
                     ", ".join(map(names.key_text, c.groups)))
        for g in c.groups:
            record = state.groups.get(g)
            if record is not None and c.reason != claims_.HELD_TWICE:
                ctx.event(record, "DeviceConflict",
                          f"{c.resource} {c.device} on node {c.node}: {c.reason} "
                          f"({', '.join(map(names.key_text, c.groups))}); it takes no new sharer "
                          "until a holder releases", warning=True)
    for g, others in ctx.conflicts.items():
        record = state.groups.get(g)
        if record is not None:
            ctx.event(record, "DeviceConflict",
                      "devices of this group are also claimed by "
                      + ", ".join(map(names.key_text, sorted(others)))
                      + "; neither keeps them exclusively until one releases", warning=True)
        logger.error("device conflict: group %s/%s shares devices with %s", *g, sorted(others))
    for problem in report.problems:
        logger.warning("rebuild: %s", problem)
    for claim in untrusted:
        ctx.metrics.untrusted_claims.inc()
        pod = claim.pod
        message = (f"annotation {names.POD_SELECTED_DEVICES_ANNOTATION}={pod.selected_devices} is ignored: "
                   f"{claim.why}")
        ctx.event(pod, "UntrustedDeviceClaim", message, warning=True)
        logger.warning("rebuild: pod %s/%s: %s", *pod.key, message)
