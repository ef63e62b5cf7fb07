"""ResourceClaims through the sandbox's HTTP API, with kube-apiserver's rules (resource.k8s.io/v1): defaults, the
spec's validation and immutability, and the status rules a scheduler's writes must follow."""

from __future__ import annotations

from typing import Any

import pytest

from deviceshare.sandbox import Sandbox
from tests.sandbox.dra_objects import CLAIMS, MERGE, RESOURCE, allocation, claim, consumer
from tests.sandbox.helpers import Http


def _messages(body: dict[str, Any]) -> list[str]:
    return [f"{c['field']}: {c['message']}" for c in body["details"]["causes"]]


async def test_discovery_serves_the_three_kinds_with_the_claim_status(http: Http) -> None:
    status, doc = await http.call("GET", RESOURCE)
    assert status == 200
    served = {r["name"]: r["namespaced"] for r in doc["resources"]}
    assert served == {"deviceclasses": False, "resourceslices": False, "resourceclaims": True,
                      "resourceclaims/status": True}
    status, groups = await http.call("GET", "/apis")
    assert {"name": "resource.k8s.io", "versions": [{"groupVersion": "resource.k8s.io/v1", "version": "v1"}],
            "preferredVersion": {"groupVersion": "resource.k8s.io/v1", "version": "v1"}} in groups["groups"]
    status, _ = await http.call("GET", "/openapi/v3/apis/resource.k8s.io/v1")
    assert status == 200


async def test_a_created_claim_is_defaulted_and_its_status_dropped(http: Http) -> None:
    body = claim(count=None)
    body["status"] = {"reservedFor": [consumer("sneaky")]}
    status, created = await http.call("POST", CLAIMS, body)
    assert status == 201, created
    assert created["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}
    assert "status" not in created


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        ({"name": "devices"}, "spec.devices.requests[0]: Required value: exactly one of `exactly` or "
                              "`firstAvailable` is required"),
        ({"name": "devices", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": -1}},
         "spec.devices.requests[0].exactly.count: Invalid value: -1: must be greater than zero"),
        ({"name": "devices", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "Some"}},
         'spec.devices.requests[0].exactly.allocationMode: Unsupported value: "Some": supported values: "All", '
         '"ExactCount"'),
        ({"name": "devices", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All", "count": 2}},
         "spec.devices.requests[0].exactly.count: Invalid value: 2: must not be specified when allocationMode is "
         "'All'"),
        ({"name": "devices", "exactly": {"count": 1}},
         "spec.devices.requests[0].exactly.deviceClassName: Required value"),
        ({"name": "Devices!", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
         'spec.devices.requests[0].name: Invalid value: "Devices!": a lowercase RFC 1123 label'),
        ({"name": "devices", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {
            "expression": "device.attributes['gpu.nvidia.com'].productName.startsWith("}}]}},
         "spec.devices.requests[0].exactly.selectors[0].cel.expression: Invalid value"),
        ({"name": "devices", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": [{}]}},
         "spec.devices.requests[0].exactly.selectors[0].cel: Required value"),
    ],
)
async def test_an_invalid_request_is_refused_with_the_api_servers_words(
    http: Http, request_: dict[str, Any], expected: str
) -> None:
    body = claim()
    body["spec"]["devices"]["requests"] = [request_]
    status, refused = await http.call("POST", CLAIMS, body)
    assert status == 422, refused
    assert refused["reason"] == "Invalid"
    assert refused["message"].startswith('ResourceClaim.resource.k8s.io "group-devices" is invalid: ')
    assert any(m.startswith(expected) for m in _messages(refused)), _messages(refused)


async def test_request_names_are_unique_and_at_most_32(http: Http) -> None:
    body = claim()
    first = body["spec"]["devices"]["requests"][0]
    body["spec"]["devices"]["requests"] = [first, dict(first)]
    status, refused = await http.call("POST", CLAIMS, body)
    assert status == 422
    assert _messages(refused) == ['spec.devices.requests[1]: Duplicate value: "devices"']
    body["spec"]["devices"]["requests"] = [{**first, "name": f"r{i}"} for i in range(33)]
    status, refused = await http.call("POST", CLAIMS, body)
    assert _messages(refused) == ["spec.devices.requests: Too many: 33: must have at most 32 items"]


async def test_a_valid_cel_selector_from_the_nvidia_examples_is_taken(http: Http) -> None:
    expression = ("device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H') && "
                  "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0")
    status, created = await http.call("POST", CLAIMS, claim(count=2, selectors=[{"cel": {"expression": expression}}]))
    assert status == 201, created


async def test_the_spec_never_changes_after_creation_but_metadata_may(http: Http) -> None:
    await http.call("POST", CLAIMS, claim())
    patch = {"spec": {"devices": {"requests": [{"name": "devices", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                                "count": 2}}]}}}
    status, refused = await http.call("PATCH", f"{CLAIMS}/group-devices", patch, content_type=MERGE)
    assert status == 422
    assert _messages(refused) == ['spec: Invalid value: "object": field is immutable']
    status, labelled = await http.call("PATCH", f"{CLAIMS}/group-devices", {"metadata": {"labels": {"a": "b"}}},
                                       content_type=MERGE)
    assert status == 200 and labelled["metadata"]["labels"] == {"a": "b"}


async def test_status_goes_through_the_subresource_only(http: Http) -> None:
    await http.call("POST", CLAIMS, claim())
    status, main = await http.call("PATCH", f"{CLAIMS}/group-devices",
                                   {"status": {"allocation": allocation("gpu-node-0", "gpu-0")}}, content_type=MERGE)
    assert status == 200 and "status" not in main
    status, written = await http.call("PATCH", f"{CLAIMS}/group-devices/status",
                                      {"status": {"allocation": allocation("gpu-node-0", "gpu-0")},
                                       "spec": {"devices": {"requests": []}}}, content_type=MERGE)
    assert status == 200, written
    assert written["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    assert written["spec"]["devices"]["requests"][0]["name"] == "devices"  # a status write keeps the spec


async def _allocated(http: Http, *reserved: dict[str, Any]) -> dict[str, Any]:
    await http.call("POST", CLAIMS, claim())
    status, written = await http.call(
        "PATCH", f"{CLAIMS}/group-devices/status",
        {"status": {"allocation": allocation("gpu-node-0", "gpu-0"), "reservedFor": list(reserved)}},
        content_type=MERGE)
    assert status == 200, written
    return written


async def test_reserved_for_needs_an_allocation(http: Http) -> None:
    await http.call("POST", CLAIMS, claim())
    status, refused = await http.call("PATCH", f"{CLAIMS}/group-devices/status",
                                      {"status": {"reservedFor": [consumer("p")]}}, content_type=MERGE)
    assert status == 422
    assert _messages(refused) == ["status.reservedFor: Forbidden: may not be specified when `allocated` is not set"]


async def test_an_allocation_is_never_changed_and_not_removed_while_reserved(http: Http) -> None:
    await _allocated(http, consumer("p"))
    status, refused = await http.call("PATCH", f"{CLAIMS}/group-devices/status",
                                      {"status": {"allocation": allocation("gpu-node-0", "gpu-1")}}, content_type=MERGE)
    assert status == 422
    assert _messages(refused) == ['status.allocation: Invalid value: "object": field is immutable']
    status, refused = await http.call("PATCH", f"{CLAIMS}/group-devices/status",
                                      {"status": {"allocation": None}}, content_type=MERGE)
    assert status == 422
    assert "may not be specified when `allocated` is not set" in refused["message"]
    status, _released = await http.call("PATCH", f"{CLAIMS}/group-devices/status",
                                       {"status": {"reservedFor": None}}, content_type=MERGE)
    assert status == 200
    status, cleared = await http.call("PATCH", f"{CLAIMS}/group-devices/status",
                                      {"status": {"allocation": None}}, content_type=MERGE)
    assert status == 200 and not cleared.get("status")
    status, again = await http.call("PATCH", f"{CLAIMS}/group-devices/status",
                                    {"status": {"allocation": allocation("gpu-node-1", "gpu-3")}}, content_type=MERGE)
    assert status == 200, again  # cleared, it may be allocated anew


async def test_reserved_for_is_unique_by_uid_complete_and_at_most_256(http: Http) -> None:
    await _allocated(http)
    twice = consumer("p")
    status, refused = await http.call("PATCH", f"{CLAIMS}/group-devices/status",
                                      {"status": {"reservedFor": [twice, {**twice, "name": "q"}]}}, content_type=MERGE)
    assert _messages(refused) == [f'status.reservedFor[1]: Duplicate value: "{twice["uid"]}"']
    status, refused = await http.call("PATCH", f"{CLAIMS}/group-devices/status",
                                      {"status": {"reservedFor": [{"resource": "pods", "name": "p"}]}},
                                      content_type=MERGE)
    assert _messages(refused) == ["status.reservedFor[0].uid: Required value"]
    status, refused = await http.call("PATCH", f"{CLAIMS}/group-devices/status",
                                      {"status": {"reservedFor": [consumer(f"p{i}") for i in range(257)]}},
                                      content_type=MERGE)
    assert _messages(refused) == ["status.reservedFor: Too many: 257: must have at most 256 items"]
    status, _ = await http.call("PATCH", f"{CLAIMS}/group-devices/status",
                                {"status": {"reservedFor": [consumer(f"p{i}") for i in range(256)]}},
                                content_type=MERGE)
    assert status == 200


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ({"request": "other"}, 'status.allocation.devices.results[0].request: Invalid value: "other": must be the '
                               "name of a request in the claim"),
        ({"shareID": "NOT-A-UUID"}, 'status.allocation.devices.results[0].shareID: Invalid value: "NOT-A-UUID"'),
        ({"pool": ""}, "status.allocation.devices.results[0].pool: Required value"),
        ({"driver": "Bad_Driver"}, 'status.allocation.devices.results[0].driver: Invalid value: "Bad_Driver"'),
    ],
)
async def test_a_new_allocation_is_validated(http: Http, result: dict[str, Any], expected: str) -> None:
    await http.call("POST", CLAIMS, claim())
    written = allocation("gpu-node-0", "gpu-0")
    written["devices"]["results"][0].update(result)
    status, refused = await http.call("PATCH", f"{CLAIMS}/group-devices/status", {"status": {"allocation": written}},
                                      content_type=MERGE)
    assert status == 422
    assert any(m.startswith(expected) for m in _messages(refused)), _messages(refused)


async def test_a_share_with_consumed_capacity_and_a_node_selector_by_name_is_taken(http: Http) -> None:
    await http.call("POST", CLAIMS, claim(capacity={"requests": {"memory": "24Gi"}}))
    written = allocation("gpu-node-0", "gpu-0", shareID="0b7c1c6e-2d4f-4c1a-9a57-3f6f0c2c1a11",
                         consumedCapacity={"memory": "24Gi"})
    status, stored = await http.call("PATCH", f"{CLAIMS}/group-devices/status", {"status": {"allocation": written}},
                                     content_type=MERGE)
    assert status == 200, stored
    written["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["key"] = "spec.nodeName"
    await http.call("PATCH", f"{CLAIMS}/group-devices/status", {"status": {"allocation": None}}, content_type=MERGE)
    status, refused = await http.call("PATCH", f"{CLAIMS}/group-devices/status", {"status": {"allocation": written}},
                                      content_type=MERGE)
    assert status == 422
    assert "nodeSelectorTerms[0].matchFields[0].key" in refused["message"]


async def test_no_new_consumer_while_the_claim_is_being_deleted(http: Http, sandbox: Sandbox) -> None:
    first = consumer("p")
    await _allocated(http, first)
    sandbox.patch("resourceclaims", "group-devices", {"metadata": {"finalizers": ["deviceshare.io/release-devices"]}},
                  "default")
    status, _ = await http.call("DELETE", f"{CLAIMS}/group-devices")
    assert status == 200
    status, refused = await http.call("PATCH", f"{CLAIMS}/group-devices/status",
                                      {"status": {"reservedFor": [first, consumer("q")]}}, content_type=MERGE)
    assert status == 422
    assert "new entries may not be added while `deallocationRequested` or `deletionTimestamp` are set" in (
        refused["message"])
    status, _ = await http.call("PATCH", f"{CLAIMS}/group-devices/status", {"status": {"reservedFor": []}},
                                content_type=MERGE)
    assert status == 200  # leaving is allowed


async def test_claims_are_watched(http: Http) -> None:
    await http.call("POST", CLAIMS, claim())
    await _allocated_again(http)
    events = await http.watch(CLAIMS, {"timeoutSeconds": "1", "resourceVersion": "0"}, limit=1)
    assert [e["type"] for e in events] == ["ADDED"]
    assert events[0]["object"]["status"]["allocation"]["devices"]["results"][0]["pool"] == "gpu-node-2"


async def _allocated_again(http: Http) -> None:
    status, _ = await http.call("PATCH", f"{CLAIMS}/group-devices/status",
                                {"status": {"allocation": allocation("gpu-node-2", "gpu-7")}}, content_type=MERGE)
    assert status == 200
