"""A group's priority is its most important member's; a pod's fields are read as the API server wrote them."""

from __future__ import annotations

from typing import Any

import pytest

from deviceshare.core import priority


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"priority": 1000, "preemptionPolicy": "Never"}, priority.PodPriority(1000, "Never")),
        ({"priority": -5}, priority.PodPriority(-5, "PreemptLowerPriority")),
        ({}, priority.PodPriority(None, "PreemptLowerPriority")),
        ({"priority": "1000", "preemptionPolicy": "Sometimes"}, priority.PodPriority(None, "PreemptLowerPriority")),
        ({"priority": True}, priority.PodPriority(None, "PreemptLowerPriority")),
    ],
)
def test_a_pods_priority_fields(spec: dict[str, Any], expected: priority.PodPriority) -> None:
    assert priority.of_pod({"spec": spec}) == expected


def test_a_groups_priority_is_its_highest_members_or_zero() -> None:
    pods = [priority.PodPriority(10), priority.PodPriority(None), priority.PodPriority(1000)]
    assert priority.group_priority(pods) == 1000
    assert priority.group_priority([priority.PodPriority(-10)]) == -10
    assert priority.group_priority([priority.PodPriority(None)]) == 0
    assert priority.group_priority([]) == 0


def test_one_member_saying_never_keeps_the_group_from_preempting() -> None:
    assert priority.may_preempt([priority.PodPriority(5)])
    assert not priority.may_preempt([priority.PodPriority(5), priority.PodPriority(5, priority.NEVER)])


def test_the_queue_takes_higher_priority_first_then_the_earlier_arrival() -> None:
    waiting = [
        (0, "2026-01-01T00:00:01Z", ("ns", "b")),
        (100, "2026-01-01T00:00:05Z", ("ns", "c")),
        (0, "2026-01-01T00:00:01Z", ("ns", "a")),
        (0, "2026-01-01T00:00:00Z", ("ns", "z")),
    ]
    order = sorted(waiting, key=lambda w: priority.queue_key(*w))
    assert [w[2][1] for w in order] == ["c", "z", "a", "b"]
