"""The joining rules (core/joining.py): one row per rule, then rows where several apply and the first wins."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from deviceshare.api import envnames, models, names
from deviceshare.core import claims, joining
from deviceshare.core import members as member_rules

GPU = "nvidia.com/gpu"
KEY = ("ml", "trainer")
ENV = envnames.EnvNames()


@dataclasses.dataclass(frozen=True)
class G:
    """A group as the rules see it (the operator passes its GroupRecord)."""

    deleting: bool = False
    spec: models.GroupSpec | None = dataclasses.field(
        default_factory=lambda: models.GroupSpec.model_validate({"resources": {GPU: 1}})
    )
    spec_error: str | None = None


def limited(max_members: int) -> G:
    return G(spec=models.GroupSpec.model_validate({"resources": {GPU: 1}, "maxMembers": max_members}))


def containers(**container: Any) -> tuple[member_rules.ContainerFacts, ...]:
    return member_rules.container_facts({"containers": [{"name": "main", **container}]})


PLAIN = containers()
ASKS_FOR_GPU = containers(resources={"limits": {GPU: "1"}})
SETS_ENV = containers(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
BROKEN = G(spec=None, spec_error="spec.resources: Field required")
HELD = claims.Allocation(KEY, "n1", {GPU: ("0",)}, claims.AllocationState.COMMITTED)
IN_FLIGHT = dataclasses.replace(HELD, state=claims.AllocationState.RESERVED)
RIVAL = ("ml", "other")

NOT_FOUND = 'SharedDeviceGroup "trainer" not found in namespace "ml"'
DELETING = 'SharedDeviceGroup "trainer" is being deleted'
INVALID = 'SharedDeviceGroup "trainer" has an invalid spec: spec.resources: Field required'
NOT_ADMISSIBLE_GPU = (
    "pod did not pass admission for SharedDeviceGroup \"trainer\": container 'main' requests nvidia.com/gpu in "
    "resources.limits, but the device group already provides it; remove it so the device plugin does not "
    "allocate it twice"
)
NOT_ADMISSIBLE_ENV = (
    "pod did not pass admission for SharedDeviceGroup \"trainer\": container 'main' sets env var "
    "NVIDIA_VISIBLE_DEVICES itself, which would override the devices of the group; remove it (deviceshare "
    "injects it)"
)
CONFLICTED = (
    'SharedDeviceGroup "trainer" holds devices also claimed by ml/other; '
    "no new member is placed until the conflict is resolved"
)
FULL = 'SharedDeviceGroup "trainer" already has 2 running member(s), its maxMembers is 2'

# (group, pod containers, conflicting groups, ledger allocation, other members running) -> verdict
ROWS: list[tuple[str, G | None, tuple[Any, ...], set[Any], claims.Allocation | None, int, joining.Verdict]] = [
    # one rule each
    ("first member places the group", G(), PLAIN, set(), None, 0, joining.Join(places_group=True)),
    ("later member joins the placed group", G(), PLAIN, set(), HELD, 3, joining.Join(places_group=False)),
    ("group missing", None, PLAIN, set(), None, 0, joining.Refuse(joining.Rule.MISSING, NOT_FOUND)),
    ("group being deleted", G(deleting=True), PLAIN, set(), HELD, 0,
     joining.Refuse(joining.Rule.DELETING, DELETING)),
    ("group spec invalid", BROKEN, PLAIN, set(), None, 0, joining.Refuse(joining.Rule.INVALID_SPEC, INVALID)),
    ("pod asks the device plugin for the group's resource", G(), ASKS_FOR_GPU, set(), None, 0,
     joining.Refuse(joining.Rule.NOT_ADMISSIBLE, NOT_ADMISSIBLE_GPU)),
    ("pod sets the group's visibility env var", G(), SETS_ENV, set(), HELD, 0,
     joining.Refuse(joining.Rule.NOT_ADMISSIBLE, NOT_ADMISSIBLE_ENV)),
    ("group's devices claimed twice", G(), PLAIN, {RIVAL}, HELD, 0,
     joining.Refuse(joining.Rule.CONFLICTED, CONFLICTED)),
    ("placement in flight", G(), PLAIN, set(), IN_FLIGHT, 0,
     joining.Wait(joining.Rule.IN_FLIGHT, "group placement in flight", joining.IN_FLIGHT_RETRY_S)),
    ("group full", limited(2), PLAIN, set(), HELD, 2, joining.Refuse(joining.Rule.FULL, FULL)),
    ("one place left", limited(2), PLAIN, set(), HELD, 1, joining.Join(places_group=False)),
    ("maxMembers 0 is unlimited", limited(0), PLAIN, set(), HELD, 500, joining.Join(places_group=False)),
    # several apply: the first in order wins
    ("missing before anything about the pod", None, ASKS_FOR_GPU, {RIVAL}, HELD, 9,
     joining.Refuse(joining.Rule.MISSING, NOT_FOUND)),
    ("deleting before an invalid spec", dataclasses.replace(BROKEN, deleting=True), ASKS_FOR_GPU, {RIVAL},
     None, 0, joining.Refuse(joining.Rule.DELETING, DELETING)),
    ("invalid spec before the member rules", BROKEN, ASKS_FOR_GPU, {RIVAL}, None, 0,
     joining.Refuse(joining.Rule.INVALID_SPEC, INVALID)),
    ("member rules before a conflict", G(), ASKS_FOR_GPU, {RIVAL}, HELD, 0,
     joining.Refuse(joining.Rule.NOT_ADMISSIBLE, NOT_ADMISSIBLE_GPU)),
    ("a conflict before a full group", limited(1), PLAIN, {RIVAL}, HELD, 5,
     joining.Refuse(joining.Rule.CONFLICTED, CONFLICTED)),
    ("a conflict before placing the group", G(), PLAIN, {RIVAL}, None, 0,
     joining.Refuse(joining.Rule.CONFLICTED, CONFLICTED)),
    ("in flight before full", limited(1), PLAIN, set(), IN_FLIGHT, 5,
     joining.Wait(joining.Rule.IN_FLIGHT, "group placement in flight", joining.IN_FLIGHT_RETRY_S)),
]


@pytest.mark.parametrize(
    ("group", "pod", "conflicting", "allocation", "running", "expected"),
    [pytest.param(*row[1:], id=row[0]) for row in ROWS],
)
def test_joining_rules(
    group: G | None,
    pod: tuple[member_rules.ContainerFacts, ...],
    conflicting: set[tuple[str, str]],
    allocation: claims.Allocation | None,
    running: int,
    expected: joining.Verdict,
) -> None:
    got = joining.verdict(
        KEY, group, containers=pod, env_names=ENV, conflicting_with=conflicting, allocation=allocation,
        running_others=running,
    )
    assert got == expected


PREEMPTED = (
    'SharedDeviceGroup "trainer" is being preempted by ml/urgent: it is placed again once its members have left'
)


@pytest.mark.parametrize(
    ("group", "allocation", "expected"),
    [
        pytest.param(G(), HELD, joining.Wait(joining.Rule.PREEMPTED, PREEMPTED, joining.PREEMPTED_RETRY_S),
                     id="a new member waits while its group's members are evicted"),
        pytest.param(G(), None, joining.Join(places_group=True), id="released already: the member places it anew"),
        pytest.param(G(deleting=True), HELD, joining.Refuse(joining.Rule.DELETING, DELETING),
                     id="deleting before preempted"),
        pytest.param(BROKEN, HELD, joining.Wait(joining.Rule.PREEMPTED, PREEMPTED, joining.PREEMPTED_RETRY_S),
                     id="preempted before an invalid spec"),
    ],
)
def test_a_preempted_group_takes_no_new_member_until_it_is_released(
    group: G, allocation: claims.Allocation | None, expected: joining.Verdict
) -> None:
    got = joining.verdict(KEY, group, containers=PLAIN, env_names=ENV, conflicting_with=(), allocation=allocation,
                          running_others=0, preempted_by="ml/urgent")
    assert got == expected


def test_running_members_matter_only_for_a_group_with_a_limit() -> None:
    """Without a maxMembers the count is never read: the scheduler counts (a walk of the members) only for a
    group that has one, and passes 0 for the others (most of them)."""
    got = joining.verdict(KEY, G(), containers=PLAIN, env_names=ENV, conflicting_with=(), allocation=HELD,
                          running_others=10**6)
    assert got == joining.Join(places_group=False)


def test_the_conflict_names_every_rival_sorted() -> None:
    got = joining.verdict(KEY, G(), containers=PLAIN, env_names=ENV,
                          conflicting_with={("ns2", "b"), ("ml", "z"), ("ml", "a")}, allocation=HELD,
                          running_others=0)
    assert isinstance(got, joining.Refuse)
    assert "also claimed by ml/a, ml/z, ns2/b;" in got.message


@pytest.mark.parametrize(
    ("annotation", "rule", "says"),
    [
        pytest.param(None, joining.Rule.UNNAMED,
                     f"pod has no {names.POD_GROUP_ANNOTATION} annotation; deviceshare-scheduler only schedules",
                     id="no annotation"),
        pytest.param("  ", joining.Rule.BAD_NAME, "is empty", id="empty"),
        pytest.param("../shareddevicegroups?watch=true", joining.Rule.BAD_NAME, "is not a valid group name",
                     id="a path in disguise"),
        pytest.param("Trainer", joining.Rule.BAD_NAME, "is not a valid group name", id="upper case"),
        pytest.param("x" * 64, joining.Rule.BAD_NAME, "at most 63 characters", id="too long"),
        pytest.param("trainer", None, None, id="a good name"),
    ],
)
def test_the_group_annotation_is_checked_before_it_is_used(
    annotation: str | None, rule: joining.Rule | None, says: str | None
) -> None:
    got = joining.name_refusal(annotation, names.DEFAULT_SCHEDULER_NAME)
    if rule is None:
        assert got is None
    else:
        assert got is not None and got.rule is rule and says is not None and says in got.message
