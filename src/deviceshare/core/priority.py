"""A group's priority and its pods' preemption policy, read from the member pods (CONTRACT §8).

The API server's Priority admission writes ``spec.priority`` and ``spec.preemptionPolicy`` on every pod
at CREATE, from its ``priorityClassName`` (or the cluster's default class); nobody can change them later.
A group has no priority of its own: it is the highest among its member pods, 0 when none carries one.
One definition, here, for the scheduling queue's order, the preemption post-filter (who may evict
whom) and the nominations (who may take devices kept for a preemptor).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

PREEMPT_LOWER_PRIORITY = "PreemptLowerPriority"
NEVER = "Never"
DEFAULT_PRIORITY = 0  # kube-apiserver's priority when no class applies (DefaultPriorityWhenNoDefaultClassExists)


@dataclass(frozen=True, slots=True)
class PodPriority:
    """What one pod says: its priority (None when the API server set none) and its preemption policy."""

    priority: int | None = None
    preemption_policy: str = PREEMPT_LOWER_PRIORITY

    @property
    def never_preempts(self) -> bool:
        return self.preemption_policy == NEVER


UNSET = PodPriority()


def of_pod(pod: Mapping[str, Any]) -> PodPriority:
    """A pod body's ``spec.priority`` and ``spec.preemptionPolicy``; anything malformed reads as unset."""
    spec = pod.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    if "priority" not in spec and "preemptionPolicy" not in spec:
        return UNSET  # most pods: one shared record, nothing built per pod
    raw = spec.get("priority")
    value = raw if isinstance(raw, int) and not isinstance(raw, bool) else None
    policy = spec.get("preemptionPolicy")
    return PodPriority(value, policy if policy in (PREEMPT_LOWER_PRIORITY, NEVER) else PREEMPT_LOWER_PRIORITY)


def group_priority(members: Iterable[PodPriority]) -> int:
    """The highest priority among a group's member pods; 0 when none carries one."""
    values = [m.priority for m in members if m.priority is not None]
    return max(values) if values else DEFAULT_PRIORITY


def may_preempt(pending: Iterable[PodPriority]) -> bool:
    """Whether a group's pending members let it evict others: not when any of them says ``Never``
    (evicting is not undone, so one member's refusal is the group's)."""
    return not any(p.never_preempts for p in pending)


def queue_key(priority: int, created: str, name: tuple[str, str]) -> tuple[int, str, tuple[str, str]]:
    """kube-scheduler's PrioritySort: higher priority first, then the earlier arrival, then the name.

    ``created`` is an RFC 3339 timestamp as the API writes it (they sort as strings)."""
    return (-priority, created, name)
