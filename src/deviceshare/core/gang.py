"""Gang start (CONTRACT §8 ``minMembers``): may a gang start now, and where, as one pure verdict.

A gang with ``minMembers: N`` binds nobody until N member pods exist and one node has room for all of
them: the group's devices or shares, and every one of the N pods' CPU and memory. kube-scheduler's
coscheduling plugin answers the same question at *permit*, after it reserved the pods' resources; here
no device may be held for a gang that has not started, so the rule is asked before reserve and holds
nothing: :func:`permit` says start (on which node, with which devices, which pods), wait for members,
or why no node can take the whole gang.

The room for N pods is one :class:`inventory.PodDemand` (:func:`demand`: the sum of their requests, and
node constraints every one of them accepts), so the placement engine (:mod:`placement`: filters, index
walk, scoring, device choice) decides for a gang exactly as for a group's first pod; there is no second
engine to disagree with it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from deviceshare.core import inventory, placement
from deviceshare.core import ledger as ledgers

WAITING_FOR_MEMBERS = "WaitingForMembers"
UNSCHEDULABLE = "Unschedulable"


@dataclass(frozen=True, slots=True)
class Member:
    """A member pod that exists (not yet bound: a gang that has not started has none bound)."""

    key: inventory.PodKey
    demand: inventory.PodDemand


@dataclass(frozen=True, slots=True)
class WaitingForMembers:
    """Fewer than N member pods exist; nothing is held meanwhile."""

    present: int
    needed: int

    reason = WAITING_FOR_MEMBERS

    def message(self) -> str:
        return f"{self.present}/{self.needed} member pods exist"


@dataclass(frozen=True, slots=True)
class Start:
    """The gang starts: reserve ``placement`` and bind ``members`` (in this order) together."""

    placement: placement.Placement
    members: tuple[inventory.PodKey, ...]


Verdict = Start | WaitingForMembers | placement.Unschedulable


def needed(min_members: int) -> int:
    """How many member pods must exist before the group is placed: N, or 1 without a gang."""
    return max(1, min_members)


def waiting(min_members: int, present: int) -> WaitingForMembers | None:
    """Fewer than N member pods exist (the count alone, before any placement is tried): wait."""
    n = needed(min_members)
    return WaitingForMembers(present, n) if present < n else None


def demand(pods: Sequence[inventory.PodDemand]) -> inventory.PodDemand:
    """One demand that fits a node exactly when all ``pods`` fit it together.

    CPU and memory add up. Node constraints are ANDed: the first pod's nodeSelector, the others' as
    ``In`` requirements (a conflict then matches no node), required node affinity as the product of
    the pods' terms (each pod's terms are ORed). Tolerations are those every pod carries: exact for
    pods from one template, conservative otherwise (a node none of them is sure to tolerate is left
    out, never the other way round).
    """
    if not pods:
        return inventory.PodDemand()
    if len(pods) == 1:
        return pods[0]
    first = pods[0]
    selector = dict(first.node_selector)
    extra: list[inventory.Requirement] = []
    for pod in pods[1:]:
        for key, value in sorted(pod.node_selector.items()):
            if key not in selector:
                selector[key] = value
            elif selector[key] != value:
                extra.append(inventory.Requirement(key, "In", (value,)))
    terms: list[inventory.NodeSelectorTerm] = []
    constrained = [p.required_terms for p in pods if p.required_terms]
    for combination in itertools.product(*constrained) if constrained else ():
        terms.append(inventory.NodeSelectorTerm(
            expressions=tuple(e for t in combination for e in t.expressions),
            fields=tuple(f for t in combination for f in t.fields),
        ))
    if extra:
        terms = [inventory.NodeSelectorTerm((*t.expressions, *extra), t.fields) for t in terms] or [
            inventory.NodeSelectorTerm(tuple(extra))
        ]
    return inventory.PodDemand(
        cpu_milli=sum(p.cpu_milli for p in pods),
        memory_bytes=sum(p.memory_bytes for p in pods),
        node_selector=selector,
        tolerations=tuple(t for t in first.tolerations if all(t in p.tolerations for p in pods[1:])),
        required_terms=tuple(terms),
    )


def permit(
    snapshot: ledgers.LedgerSnapshot,
    request: placement.GroupRequest,
    min_members: int,
    members: Sequence[Member],
    policy: placement.Policy | None = None,
) -> Verdict:
    """May the group (holding no device yet) start, with its existing ``members`` in bind order?

    Waits while fewer than N exist; else places the group for the first N together (with ``policy``
    when the group's strategy has one), or says why no node takes them all, counted per node as
    kube-scheduler counts (``0/12 nodes are available: 7 insufficient cpu, ...``).
    """
    short = waiting(min_members, len(members))
    if short is not None:
        return short
    chosen = tuple(members[: needed(min_members)])
    together = demand([m.demand for m in chosen])
    decision = (
        placement.place_on(snapshot, request, together)
        if policy is None
        else placement.place_by_policy(snapshot, request, together, policy)
    )
    if isinstance(decision, placement.Unschedulable):
        return decision
    return Start(decision, tuple(m.key for m in chosen))


def describe(verdict: WaitingForMembers | placement.Unschedulable, min_members: int) -> str:
    """The message a waiting gang shows (``Scheduled=False``): who is missing, or why no node fits all."""
    if isinstance(verdict, WaitingForMembers):
        return verdict.message()
    n = needed(min_members)
    return verdict.message() if n == 1 else f"gang of {n} member pods: {verdict.message()}"
