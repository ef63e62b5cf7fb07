"""PodDisruptionBudget arithmetic by table: what a budget selects, expects, wants healthy and allows."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from deviceshare.sandbox import budgets

NOW = datetime.datetime(2026, 11, 24, 12, 0, tzinfo=datetime.UTC)
DEPLOY = {"kind": "Deployment", "name": "web", "uid": "d1", "controller": True}
JOB = {"kind": "Job", "name": "train", "uid": "j1", "controller": True}


def pdb(spec: dict[str, Any], status: dict[str, Any] | None = None, ns: str = "default") -> dict[str, Any]:
    return {"metadata": {"name": "b", "namespace": ns, "generation": 1}, "spec": spec, "status": status or {}}


def pod(name: str, *, ready: bool = True, owner: dict[str, Any] | None = None, deleting: bool = False,
        labels: dict[str, str] | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": "default", "labels": labels or {"app": "web"}}
    if owner:
        md["ownerReferences"] = [owner]
    if deleting:
        md["deletionTimestamp"] = "2026-11-24T12:00:00Z"
    return {"metadata": md, "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


@pytest.mark.parametrize(
    ("selector", "labels", "selected"),
    [
        (None, {"app": "web"}, False),  # no selector: nothing
        ({}, {"any": "thing"}, True),  # policy/v1: the empty selector selects every pod
        ({"matchLabels": {"app": "web"}}, {"app": "web"}, True),
        ({"matchExpressions": [{"key": "app", "operator": "In", "values": ["db"]}]}, {"app": "web"}, False),
        ({"matchExpressions": [{"key": "app", "operator": "Sideways"}]}, {"app": "web"}, False),  # invalid: none
    ],
)
def test_what_a_budget_selects(selector: dict[str, Any] | None, labels: dict[str, str], selected: bool) -> None:
    spec = {} if selector is None else {"selector": selector}
    assert budgets.selects(pdb(spec), pod("p", labels=labels)) is selected
    assert not budgets.selects(pdb({"selector": {}}, ns="other"), pod("p"))


def scale(ref: dict[str, Any], namespace: str) -> int | None:
    return 4 if ref["kind"] == "Deployment" else None


@pytest.mark.parametrize(
    ("spec", "pods", "expected", "desired"),
    [
        ({"minAvailable": 2}, [pod("a"), pod("b"), pod("c")], 3, 2),
        ({"minAvailable": "50%"}, [pod("a", owner=DEPLOY), pod("b", owner=DEPLOY)], 4, 2),
        ({"minAvailable": "30%"}, [pod("a", owner=DEPLOY)], 4, 2),  # 1.2 rounds up
        ({"maxUnavailable": 1}, [pod("a", owner=DEPLOY)], 4, 3),
        ({"maxUnavailable": "25%"}, [pod("a", owner=DEPLOY)], 4, 3),
        ({"maxUnavailable": "10%"}, [pod("a", owner=DEPLOY)], 4, 3),  # 0.4 rounds up to 1 unavailable
        ({"maxUnavailable": 1}, [pod("bare"), pod("a", owner=DEPLOY)], 4, 3),  # a bare pod counts for nothing
        ({"maxUnavailable": 1}, [pod("bare")], 0, 0),
    ],
)
def test_expected_and_desired(spec: dict[str, Any], pods: list[dict[str, Any]], expected: int, desired: int) -> None:
    assert budgets.expected_and_desired(pdb(spec), pods, scale) == (expected, desired)


def test_a_controller_without_a_scale_fails_safe() -> None:
    status, recheck = budgets.status_of(pdb({"maxUnavailable": 1}), [pod("t", owner=JOB)], scale, NOW)
    assert status["disruptionsAllowed"] == 0 and recheck is None
    (condition,) = status["conditions"]
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "False", "SyncFailed", 'found no controllers for pod "t"')


def test_healthy_excludes_unready_deleting_and_recently_evicted_pods() -> None:
    pods = [pod("a"), pod("b", ready=False), pod("c", deleting=True), pod("d"), pod("e")]
    evicted = {"disruptedPods": {"d": "2026-11-24T11:59:30Z", "e": "2026-11-24T11:57:00Z", "c": "2026-11-24T11:59:59Z"}}
    status, recheck = budgets.status_of(pdb({"minAvailable": 1}, evicted), pods, scale, NOW)
    # a and e are healthy (e's eviction is over two minutes old and it is still here); d is leaving
    assert (status["currentHealthy"], status["disruptionsAllowed"], status["disruptedPods"]) == (
        2, 1, {"d": "2026-11-24T11:59:30Z"})
    assert recheck == pytest.approx(90)
    assert status["conditions"][0]["reason"] == "SufficientPods"


def test_nothing_is_allowed_while_no_pod_is_expected() -> None:
    status, _ = budgets.status_of(pdb({"minAvailable": 0}), [], scale, NOW)
    assert (status["expectedPods"], status["disruptionsAllowed"]) == (0, 0)
