"""CRD schema and CEL rules: bad SharedDeviceGroups are rejected with 422, as on a real cluster."""

from __future__ import annotations

from typing import Any

import pytest

from deviceshare.sandbox import Sandbox
from tests.sandbox.helpers import SDG, Http, sdg

MERGE = "application/merge-patch+json"


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({}, "spec", "exactly one of spec.claim and spec.resources must be set"),
        ({"resources": {}}, "spec.resources", "should have at least 1 properties"),
        ({"resources": {"nvidia.com/gpu": 0}}, "spec.resources.nvidia.com/gpu", "greater than or equal to 1"),
        ({"resources": {"nvidia.com/gpu": 65}}, "spec.resources.nvidia.com/gpu", "less than or equal to 64"),
        (
            {"resources": {"nvidia.com/gpu": "two"}},
            "spec.resources.nvidia.com/gpu",
            "must be of type integer",
        ),
        ({"resources": {"gpu": 1}}, "spec.resources", "resource names must be extended resources"),
        (
            {"resources": {"nvidia.com/gpu": 1}, "schedulingStrategy": "random"},
            "spec.schedulingStrategy",
            'Unsupported value: "random": supported values: "binpack", "spread"',
        ),
        (
            {"resources": {"nvidia.com/gpu": 1}, "maxMembers": -1},
            "spec.maxMembers",
            "greater than or equal to 0",
        ),
        (
            {"resources": {"nvidia.com/gpu": 1}, "nodeSelector": {"k": "v" * 64}},
            "spec.nodeSelector.k",
            "Too long",
        ),
        (
            {"resources": {"nvidia.com/gpu": 1}, "share": {"amd.com/gpu": {"compute": "250m"}}},
            "spec",
            "every key of spec.share must also be in spec.resources",
        ),
        (
            {"resources": {"nvidia.com/gpu": 1}, "share": {"nvidia.com/gpu": {"compute": 0.5}}},
            "spec.share.nvidia.com/gpu.compute",
            "must be of type integer,string",
        ),
        (
            {"resources": {"nvidia.com/gpu": 1}, "share": {"nvidia.com/gpu": {"compute": "1500m"}}},
            "spec.share.nvidia.com/gpu.compute",
            "should match",
        ),
        (
            {"resources": {"gpu.intel.com/i915": 1}, "share": {"gpu.intel.com/i915": {"tiles": 1, "memory": "1Gi"}}},
            "spec.share.gpu.intel.com/i915",
            "a share entry needs compute, memory or both, or tiles alone",
        ),
    ],
)
async def test_schema_rejects_bad_specs_with_422(
    http: Http, spec: dict[str, Any], field: str, words: str
) -> None:
    body = sdg("bad")
    body["spec"] = spec
    status, error = await http.call("POST", SDG, body)
    assert (status, error["reason"]) == (422, "Invalid")
    causes = {c["field"]: c["message"] for c in error["details"]["causes"]}
    assert field in causes and words in causes[field], causes
    assert error["message"].startswith('SharedDeviceGroup.deviceshare.io "bad" is invalid: ')


async def test_defaults_are_applied_and_unknown_fields_pruned(http: Http) -> None:
    body = sdg("g")
    body["spec"]["surprise"] = True
    status, created = await http.call("POST", SDG, body)
    assert status == 201
    assert created["spec"] == {
        "resources": {"nvidia.com/gpu": 1},
        "schedulingStrategy": "binpack",
        "maxMembers": 0,
        "minMembers": 0,
    }


async def test_strict_field_validation_rejects_unknown_fields(http: Http) -> None:
    body = sdg("g")
    body["spec"]["surprise"] = True
    status, error = await http.call("POST", SDG, body, params={"fieldValidation": "Strict"})
    assert status == 400 and 'unknown field "spec.surprise"' in error["message"]


async def _bound_group(sandbox: Sandbox, http: Http, **spec: Any) -> None:
    await http.call("POST", SDG, sdg("g", **spec))
    status, _ = await http.call(
        "PATCH", f"{SDG}/g/status", {"status": {"phase": "Bound"}}, content_type=MERGE
    )
    assert status == 200


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (
            {"spec": {"resources": {"nvidia.com/gpu": 2}}},
            "spec.resources is immutable once the group is Bound",
        ),
        ({"spec": {"nodeSelector": {"zone": "a"}}}, "spec.nodeSelector is immutable once the group is Bound"),
        ({"spec": {"share": {"nvidia.com/gpu": {"compute": "600m"}}}}, "spec.share is immutable"),
        ({"spec": {"share": None}}, "spec.share is immutable once the group is Bound"),
        ({"spec": {"minMembers": 2}}, "spec.minMembers is immutable once the group is Bound"),
    ],
)
async def test_cel_transition_rules_freeze_a_bound_group(
    sandbox: Sandbox, http: Http, patch: dict[str, Any], message: str
) -> None:
    await _bound_group(sandbox, http, share={"nvidia.com/gpu": {"compute": "250m"}})
    status, error = await http.call("PATCH", f"{SDG}/g", patch, content_type=MERGE)
    assert status == 422 and message in error["message"]


async def test_cel_rules_allow_changes_while_pending_and_other_fields_when_bound(
    http: Http, sandbox: Sandbox
) -> None:
    await http.call("POST", SDG, sdg("g"))
    status, _ = await http.call(
        "PATCH", f"{SDG}/g", {"spec": {"resources": {"nvidia.com/gpu": 3}}}, content_type=MERGE
    )
    assert status == 200
    await http.call("PATCH", f"{SDG}/g/status", {"status": {"phase": "Bound"}}, content_type=MERGE)
    status, _ = await http.call("PATCH", f"{SDG}/g", {"spec": {"maxMembers": 4}}, content_type=MERGE)
    assert status == 200


async def test_status_is_validated_too(http: Http) -> None:
    await http.call("POST", SDG, sdg("g"))
    status, error = await http.call(
        "PATCH", f"{SDG}/g/status", {"status": {"phase": "Lost"}}, content_type=MERGE
    )
    assert status == 422 and "status.phase" in error["message"]


async def test_pods_need_containers(http: Http) -> None:
    status, error = await http.call(
        "POST", "/api/v1/namespaces/default/pods", {"metadata": {"name": "p"}, "spec": {}}
    )
    assert status == 422 and "spec.containers: Required value" in error["message"]


async def test_names_must_be_dns_subdomains(http: Http) -> None:
    status, error = await http.call("POST", SDG, sdg("Not_Valid"))
    assert status == 422 and "metadata.name" in error["message"]


@pytest.mark.parametrize("name", ["team.a", "g" * 70, "a" * 64])
async def test_a_name_no_pod_can_join_is_refused_saying_why(http: Http, name: str) -> None:
    """Object names may hold '.' and 253 characters; a pod's group annotation takes a DNS-1123 label only."""
    status, error = await http.call("POST", SDG, sdg(name))
    assert (status, error["reason"]) == (422, "Invalid"), error
    assert "a group's name must be a DNS-1123 label" in error["message"]
    assert "deviceshare.io/device-group annotation" in error["message"]


@pytest.mark.parametrize("name", ["team-a", "a" * 63, "0"])
async def test_a_name_pods_can_join_is_accepted(http: Http, name: str) -> None:
    status, created = await http.call("POST", SDG, sdg(name))
    assert status == 201, created


@pytest.mark.parametrize(
    ("spec", "accepted"),
    [
        ({"minMembers": 3, "maxMembers": 3}, True),
        ({"minMembers": 3}, True),  # maxMembers 0: unlimited
        ({"minMembers": 4, "maxMembers": 3}, False),
        ({"minMembers": -1}, False),
    ],
)
async def test_a_gang_fits_its_group(http: Http, spec: dict[str, Any], accepted: bool) -> None:
    status, answer = await http.call("POST", SDG, sdg("g", **spec))
    if accepted:
        assert status == 201 and answer["spec"]["minMembers"] == spec["minMembers"]
        return
    assert (status, answer["reason"]) == (422, "Invalid")
    assert "minMembers" in answer["message"], answer["message"]
