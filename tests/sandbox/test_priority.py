"""PriorityClasses and the Priority admission plugin through the sandbox's HTTP API, as kube-apiserver has them."""

from __future__ import annotations

from typing import Any

import pytest

from deviceshare.sandbox import Sandbox
from tests.sandbox.helpers import PODS, Http, pod

PCS = "/apis/scheduling.k8s.io/v1/priorityclasses"


def priority_class(name: str, value: int, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
            "value": value, **extra}


async def test_the_two_system_classes_exist_from_the_start(http: Http) -> None:
    status, listed = await http.call("GET", PCS)
    assert status == 200
    assert {i["metadata"]["name"]: (i["value"], i["preemptionPolicy"]) for i in listed["items"]} == {
        "system-cluster-critical": (2000000000, "PreemptLowerPriority"),
        "system-node-critical": (2000001000, "PreemptLowerPriority"),
    }


async def test_a_pod_gets_its_class_priority_and_preemption_policy(http: Http) -> None:
    status, _ = await http.call("POST", PCS, priority_class("inference", 1000, preemptionPolicy="Never"))
    assert status == 201
    status, created = await http.call("POST", PODS, pod("p", priorityClassName="inference"))
    assert status == 201
    assert (created["spec"]["priority"], created["spec"]["preemptionPolicy"]) == (1000, "Never")
    status, plain = await http.call("POST", PODS, pod("q"))
    assert (plain["spec"]["priority"], plain["spec"]["preemptionPolicy"]) == (0, "PreemptLowerPriority")
    assert "priorityClassName" not in plain["spec"]
    status, critical = await http.call("POST", PODS, pod("c", priorityClassName="system-node-critical"))
    assert critical["spec"]["priority"] == 2000001000


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"priorityClassName": "nope"}, 'pods "p" is forbidden: no PriorityClass with name nope was found'),
        (
            {"priorityClassName": "batch", "priority": 7},
            'pods "p" is forbidden: the integer value of priority (7) must not be provided in pod spec; '
            "priority admission controller computed 10 from the given PriorityClass name",
        ),
        (
            {"priorityClassName": "batch", "preemptionPolicy": "Never"},
            'pods "p" is forbidden: the string value of PreemptionPolicy (Never) must not be provided in pod spec; '
            "priority admission controller computed PreemptLowerPriority from the given PriorityClass name",
        ),
        ({"priority": 5}, 'pods "p" is forbidden: the integer value of priority (5) must not be provided'),
    ],
)
async def test_the_plugin_refuses_what_disagrees_with_the_class(http: Http, spec: dict[str, Any], message: str) -> None:
    await http.call("POST", PCS, priority_class("batch", 10))
    status, answer = await http.call("POST", PODS, pod("p", **spec))
    assert (status, answer["reason"]) == (403, "Forbidden")
    assert answer["message"].startswith(message), answer["message"]


async def test_a_pod_agreeing_with_its_class_is_admitted(http: Http) -> None:
    await http.call("POST", PCS, priority_class("batch", 10))
    status, created = await http.call("POST", PODS, pod("p", priorityClassName="batch", priority=10))
    assert status == 201 and created["spec"]["priority"] == 10


async def test_one_global_default_names_and_ranks_every_pod_without_a_class(http: Http) -> None:
    status, _ = await http.call("POST", PCS, priority_class("standard", 100, globalDefault=True))
    assert status == 201
    status, answer = await http.call("POST", PCS, priority_class("other", 5, globalDefault=True))
    assert (status, answer["message"]) == (403, 'priorityclasses.scheduling.k8s.io "other" is forbidden: '
                                                "PriorityClass standard is already marked as default. "
                                                "Only one default can exist")
    status, created = await http.call("POST", PODS, pod("p"))
    assert (created["spec"]["priority"], created["spec"]["priorityClassName"]) == (100, "standard")


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        (priority_class("huge", 1_000_000_001), "value",
         "Forbidden: maximum allowed value of a user defined priority is 1000000000"),
        (priority_class("system-mine", 5), "metadata.name",
         "priority class names with 'system-' prefix are reserved for system use only. "
         "error: system-mine is not a known system priority class"),
        (priority_class("odd", 5, preemptionPolicy="Sometimes"), "preemptionPolicy",
         'Unsupported value: "Sometimes": supported values: "Never", "PreemptLowerPriority"'),
    ],
)
async def test_classes_are_validated(http: Http, body: dict[str, Any], field: str, words: str) -> None:
    status, answer = await http.call("POST", PCS, body)
    assert (status, answer["reason"]) == (422, "Invalid")
    causes = {c["field"]: c["message"] for c in answer["details"]["causes"]}
    assert words in causes[field], causes


async def test_value_and_policy_never_change(http: Http) -> None:
    await http.call("POST", PCS, priority_class("batch", 10))
    status, answer = await http.call("PATCH", f"{PCS}/batch", {"value": 11},
                                     content_type="application/merge-patch+json")
    assert status == 422 and "value: Forbidden: may not be changed in an update." in answer["message"]
    status, answer = await http.call("PATCH", f"{PCS}/batch", {"preemptionPolicy": "Never"},
                                     content_type="application/merge-patch+json")
    assert status == 422 and "field is immutable" in answer["message"]
    status, _ = await http.call("PATCH", f"{PCS}/batch", {"description": "batch jobs"},
                                content_type="application/merge-patch+json")
    assert status == 200


async def test_the_in_process_admitted_create_goes_through_the_plugin(sandbox: Sandbox) -> None:
    created = await sandbox.create_admitted(pod("p", priorityClassName="system-cluster-critical"))
    assert created["spec"]["priority"] == 2000000000
