"""Whether a pod may join its SharedDeviceGroup now: the scheduler's joining rules as one pure function.

The webhook applies the member rules (:mod:`.members`) once, at CREATE. Before it places a group or binds a
member the operator applies them again, plus what only it knows at that moment: whether the group exists,
is being deleted, has a usable spec, holds devices another group claims too (found at rebuild), is being
placed right now, or already has ``maxMembers`` pods running. Kept here, in order and free of I/O, so the
precedence is written down once and each rule is tested by a table row; the scheduler only acts on the
verdict (and checks the group's node still has room for the pod: that is placement, :mod:`.placement`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Collection, Sequence
from typing import Protocol

from deviceshare.api import envnames, models, names

from . import claims
from . import members as member_rules

GroupKey = tuple[str, str]

IN_FLIGHT_RETRY_S = 0.1  # a placement in flight is one status write away from done
PREEMPTED_RETRY_S = 1.0  # a preempted group's members are being evicted: a release is seconds away


class Rule(enum.Enum):
    """Why a pod may not join (yet), in the order the rules are applied."""

    UNNAMED = "unnamed"  # no group annotation
    BAD_NAME = "bad-name"  # the annotation is not a group name
    MISSING = "missing"
    DELETING = "deleting"
    PREEMPTED = "preempted"  # its members are being evicted for a higher-priority group: wait for the release
    INVALID_SPEC = "invalid-spec"
    NOT_ADMISSIBLE = "not-admissible"  # the webhook's member rules refuse the pod
    CONFLICTED = "conflicted"  # the group's devices are claimed twice
    IN_FLIGHT = "in-flight"  # the group's placement is not persisted yet: wait, do not refuse
    FULL = "full"  # maxMembers pods already run


class Group(Protocol):
    """What the rules read of a group (the operator's ``GroupRecord`` is one)."""

    @property
    def deleting(self) -> bool: ...

    @property
    def spec(self) -> models.GroupSpec | None: ...

    @property
    def spec_error(self) -> str | None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Join:
    """The pod may join. ``places_group``: no devices are held yet, so placing this pod places the group."""

    places_group: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Refuse:
    """The pod may not join; ``message`` goes on the pod (FailedScheduling, PodScheduled=False)."""

    rule: Rule
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class Wait:
    """Not now, but nothing is wrong: ask again after ``retry_after`` seconds."""

    rule: Rule
    message: str
    retry_after: float


Verdict = Join | Refuse | Wait


def name_refusal(annotation: str | None, scheduler_name: str) -> Refuse | None:
    """The rules on the pod's group annotation alone, applied before the name is used anywhere (it goes
    into API paths, locks and statuses: ``../shareddevicegroups?watch=true`` once turned a GET into a watch)."""
    if annotation is None:
        return Refuse(
            Rule.UNNAMED,
            f"pod has no {names.POD_GROUP_ANNOTATION} annotation; "
            f"{scheduler_name} only schedules members of a SharedDeviceGroup",
        )
    problem = member_rules.group_name_problem(annotation)
    return None if problem is None else Refuse(Rule.BAD_NAME, problem)


def verdict(
    key: GroupKey,
    group: Group | None,
    *,
    containers: Sequence[member_rules.ContainerFacts],
    env_names: envnames.EnvNames,
    conflicting_with: Collection[GroupKey],
    allocation: claims.Allocation | None,
    running_others: int,
    preempted_by: str | None = None,
) -> Verdict:
    """May a pod with ``containers`` join group ``key`` now? The first rule that applies decides.

    ``conflicting_with``: the other groups that claim some of this group's devices; ``allocation``: what
    the ledger holds for the group; ``running_others``: how many other members run on its devices (read only
    when the group has a ``maxMembers``: a caller counts only for such a group, 0 for any other);
    ``preempted_by``: who evicts the group's members (CONTRACT §8) — a new member waits for the release
    instead of joining the node being emptied. A value each, no callback: the core never calls the operator."""
    namespace, name = key
    if group is None:
        return Refuse(Rule.MISSING, f'SharedDeviceGroup "{name}" not found in namespace "{namespace}"')
    if group.deleting:
        return Refuse(Rule.DELETING, f'SharedDeviceGroup "{name}" is being deleted')
    if preempted_by is not None and allocation is not None:
        return Wait(
            Rule.PREEMPTED, f'SharedDeviceGroup "{name}" is being preempted by {preempted_by}: '
            "it is placed again once its members have left", PREEMPTED_RETRY_S,
        )
    spec = group.spec
    if spec is None:
        return Refuse(Rule.INVALID_SPEC, f'SharedDeviceGroup "{name}" has an invalid spec: {group.spec_error}')
    # Visibility and a share's limit variables (CONTRACT §7): the same list the webhook checks.
    refused = next(member_rules.conflicts(containers, spec.resources, env_names.for_group(spec)), None)
    if refused is not None:
        # The webhook denies such a pod at CREATE; this one never met it (annotated after creation).
        return Refuse(
            Rule.NOT_ADMISSIBLE, f'pod did not pass admission for SharedDeviceGroup "{name}": {refused}'
        )
    if conflicting_with:
        others = ", ".join(map(names.key_text, sorted(conflicting_with)))
        return Refuse(
            Rule.CONFLICTED,
            f'SharedDeviceGroup "{name}" holds devices also claimed by {others}; '
            "no new member is placed until the conflict is resolved",
        )
    if allocation is None:
        return Join(places_group=True)
    if allocation.state is not claims.AllocationState.COMMITTED:
        return Wait(Rule.IN_FLIGHT, "group placement in flight", IN_FLIGHT_RETRY_S)
    limit = spec.max_members
    if limit and (running := running_others) >= limit:
        return Refuse(
            Rule.FULL,
            f'SharedDeviceGroup "{name}" already has {running} running member(s), its maxMembers is {limit}',
        )
    return Join(places_group=False)
