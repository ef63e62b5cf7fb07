"""What placement is asked and what it answers: the terms every placement policy shares.

A :class:`GroupRequest` is a group's devices, node selector, strategy and share, read from its spec; the
answer is a :class:`Placement` (a node, its devices and tiles, the ledger revision it was decided at) or
:class:`Unschedulable` (every node's first failing reason, counted, as kube-scheduler's ``0/N nodes are
available: ...``). :class:`Policy` and :class:`IndexedPolicy` are the seam for scoring other than
binpack/spread (``fgd``). The engine that decides is :mod:`placement`, which re-exports all of these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from deviceshare.api import models
from deviceshare.core import capacity, inventory, reasons, snapshots

BINPACK = "binpack"
SPREAD = "spread"
NVIDIA_PREFIX = "nvidia.com/"  # MPS enforces shares of these devices (needs_mps)


@dataclass(frozen=True, slots=True)
class GroupRequest:
    key: inventory.GroupKey
    resources: Mapping[str, int]
    node_selector: Mapping[str, str]
    strategy: str = BINPACK  # binpack | spread
    share: Mapping[str, capacity.Share] = field(default_factory=dict)  # resource -> share; absent: whole
    mps: bool = False  # only nodes with an MPS control daemon ready (CONTRACT §9) may take it

    @classmethod
    def from_spec(cls, key: inventory.GroupKey, spec: models.GroupSpec, *, mps: bool = False) -> GroupRequest:
        """``mps``: the operator enforces shares with MPS (``--mps``), so a compute or memory share of an
        NVIDIA device goes only to a node that says ``deviceshare.io/mps: ready``."""
        share = capacity.shares_from_spec(spec.share)
        return cls(
            key=key,
            resources=spec.requested,  # a DRA group's: {DeviceClass: count} (CONTRACT §13)
            node_selector=dict(spec.node_selector),
            strategy=spec.scheduling_strategy,
            share=share,
            mps=mps and needs_mps(share),
        )


def needs_mps(share: Mapping[str, capacity.Share]) -> bool:
    """A compute or memory share of an NVIDIA device: what an MPS control daemon enforces (tiles need none)."""
    return any(
        (s.compute_milli or s.memory_bytes) and r.startswith(NVIDIA_PREFIX) for r, s in share.items()
    )


@dataclass(frozen=True, slots=True)
class Placement:
    node: str
    devices: Mapping[str, tuple[str, ...]]
    revision: int  # the ledger revision the decision was taken at
    tiles: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # resource -> "<device>.<tile>"


@dataclass(frozen=True, slots=True)
class Unschedulable:
    reasons: Mapping[str, int]  # reason -> number of nodes rejected for it (first failing reason)
    total_nodes: int

    def message(self) -> str:
        """``0/12 nodes are available: 7 insufficient nvidia.com/gpu, 5 not in shared mode.``"""
        if self.total_nodes == 0 and not self.reasons:
            return f"0/0 nodes are available: {reasons.NO_NODES}."
        counted = ", ".join(f"{n} {reason}" for reason, n in sorted(self.reasons.items()))
        return f"0/{self.total_nodes} nodes are available: {counted}."


class Policy(Protocol):
    """Chooses among the nodes that fit: the seam for scoring other than binpack/spread.

    ``feasible`` holds every open node that passes all filters for the group, by name; return one
    of them, or None to leave the group Pending. :func:`placement.device_choice` gives the devices (and
    tiles) the default order would take on a node; a policy may take its own.
    """

    def choose(
        self, snapshot: snapshots.LedgerSnapshot, request: GroupRequest, feasible: Sequence[snapshots.NodeState]
    ) -> Placement | None: ...


@runtime_checkable
class IndexedPolicy(Protocol):
    """A policy that walks its own index instead of being offered every feasible node.

    ``fits`` is the placement's full filter for the group's first pod (selector, taints, cpu and
    memory, devices); the policy returns a placement on a node that passes it, or why none does.
    """

    def place(
        self, snapshot: snapshots.LedgerSnapshot, request: GroupRequest, pod: inventory.PodDemand,
        fits: Callable[[snapshots.NodeState], bool],
    ) -> Placement | Unschedulable: ...
