"""ResourceSlices and DeviceClasses through the sandbox's HTTP API, validated as kube-apiserver does."""

from __future__ import annotations

from typing import Any

import pytest

from tests.sandbox.dra_objects import CLASSES, MERGE, SLICES, device_class, resource_slice
from tests.sandbox.helpers import Http


def _messages(body: dict[str, Any]) -> list[str]:
    return [f"{c['field']}: {c['message']}" for c in body["details"]["causes"]]


GPU = {"name": "gpu-0", "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"},
                                       "cudaComputeCapability": {"version": "9.0.0"}},
       "capacity": {"memory": {"value": "80Gi"}}}


async def test_slices_are_listed_by_node_and_driver(http: Http) -> None:
    for node in ("gpu-node-0", "gpu-node-1"):
        status, created = await http.call("POST", SLICES, resource_slice(node, GPU))
        assert status == 201, created
    status, other = await http.call("POST", SLICES, {**resource_slice("gpu-node-2"), "metadata": {"name": "net"},
                                                     "spec": {**resource_slice("gpu-node-2")["spec"],
                                                              "driver": "net.example.com"}})
    assert status == 201, other
    status, listed = await http.call("GET", SLICES, params={"fieldSelector": "spec.nodeName=gpu-node-1"})
    assert [s["metadata"]["name"] for s in listed["items"]] == ["gpu-node-1-slice"]
    status, listed = await http.call("GET", SLICES, params={"fieldSelector": "spec.driver=gpu.nvidia.com"})
    assert sorted(s["metadata"]["name"] for s in listed["items"]) == ["gpu-node-0-slice", "gpu-node-1-slice"]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"nodeName": None}, "spec: Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
                             "`perDeviceNodeSelection` is required"),
        ({"allNodes": True}, 'spec: Invalid value: "{`nodeName`, `allNodes`}": exactly one of `nodeName`, '
                             "`nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required, but multiple "
                             "fields are set"),
        ({"pool": {"name": "gpu-node-0", "generation": 1, "resourceSliceCount": 0}},
         "spec.pool.resourceSliceCount: Invalid value: 0: must be greater than zero"),
        ({"pool": {"name": "", "generation": 1, "resourceSliceCount": 1}}, "spec.pool.name: Required value"),
        ({"driver": ""}, "spec.driver: Required value"),
        ({"devices": [GPU, GPU]}, 'spec.devices[1]: Duplicate value: "gpu-0"'),
        ({"devices": [{"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-1", "int": 1}}}]},
         'spec.devices[0].attributes[uuid]: Invalid value: "object": exactly one value must be specified'),
        ({"devices": [{"name": "gpu-0", "attributes": {"driverVersion": {"version": "580"}}}]},
         'spec.devices[0].attributes[driverVersion].version: Invalid value: "580": must be a string compatible '
         "with semver.org spec 2.0.0"),
        ({"devices": [{"name": "gpu-0", "capacity": {"memory": {"value": "80Gi", "requestPolicy": {
            "default": "1Gi"}}}}]},
         "spec.devices[0].capacity[memory].requestPolicy: Forbidden: allowMultipleAllocations must be true"),
        ({"devices": [{"name": "gpu-0", "taints": [{"key": "gpu.nvidia.com/xid", "effect": "PreferNoSchedule"}]}]},
         'spec.devices[0].taints[0].effect: Unsupported value: "PreferNoSchedule": supported values: '
         '"NoExecute", "NoSchedule", "None"'),
        ({"devices": [{"name": f"gpu-{i}"} for i in range(129)]},
         "spec.devices: Too many: 129: must have at most 128 items"),
        ({"devices": [{"name": f"gpu-{i}", "taints": [{"key": "k", "effect": "NoSchedule"}]} for i in range(65)]},
         "spec.devices: Too many: 65: must have at most 64 items"),
    ],
)
async def test_an_invalid_slice_is_refused(http: Http, spec: dict[str, Any], expected: str) -> None:
    status, refused = await http.call("POST", SLICES, resource_slice("gpu-node-0", GPU, **spec))
    assert status == 422, refused
    assert refused["message"].startswith('ResourceSlice.resource.k8s.io "gpu-node-0-slice" is invalid: ')
    assert any(m.startswith(expected) for m in _messages(refused)), _messages(refused)


async def test_a_shared_device_may_have_a_request_policy(http: Http) -> None:
    shared = {"name": "gpu-0", "allowMultipleAllocations": True, "capacity": {"memory": {
        "value": "80Gi", "requestPolicy": {"default": "80Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}}}}
    status, created = await http.call("POST", SLICES, resource_slice("gpu-node-0", shared))
    assert status == 201, created


async def test_a_device_taint_gets_the_time_it_was_added(http: Http) -> None:
    tainted = {"name": "gpu-0", "taints": [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"},
                                          {"key": "k", "effect": "None", "timeAdded": "2026-01-02T03:04:05Z"}]}
    status, created = await http.call("POST", SLICES, resource_slice("gpu-node-0", tainted))
    assert status == 201, created
    first, second = created["spec"]["devices"][0]["taints"]
    assert first["timeAdded"].endswith("Z") and len(first["timeAdded"]) == 20
    assert second["timeAdded"] == "2026-01-02T03:04:05Z"


async def test_driver_pool_and_node_are_immutable_and_devices_may_change(http: Http) -> None:
    await http.call("POST", SLICES, resource_slice("gpu-node-0", GPU))
    status, refused = await http.call("PATCH", f"{SLICES}/gpu-node-0-slice",
                                      {"spec": {"driver": "gpu.example.com", "nodeName": "gpu-node-1"}},
                                      content_type=MERGE)
    assert status == 422
    assert _messages(refused) == ['spec.driver: Invalid value: "gpu.example.com": field is immutable',
                                  'spec.nodeName: Invalid value: "gpu-node-1": field is immutable']
    status, changed = await http.call("PATCH", f"{SLICES}/gpu-node-0-slice",
                                      {"spec": {"pool": {"name": "gpu-node-0", "generation": 2,
                                                         "resourceSliceCount": 1},
                                                "devices": [GPU, {**GPU, "name": "gpu-1"}]}}, content_type=MERGE)
    assert status == 200, changed
    assert changed["metadata"]["generation"] == 2


async def test_a_device_class_needs_compiling_cel_selectors(http: Http) -> None:
    status, created = await http.call("POST", CLASSES, device_class(
        "gpu.nvidia.com", "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"))
    assert status == 201, created
    status, refused = await http.call("POST", CLASSES, device_class("broken", "device.driver =="))
    assert status == 422
    assert _messages(refused)[0].startswith("spec.selectors[0].cel.expression: Invalid value: \"device.driver ==\"")
    status, refused = await http.call("POST", CLASSES, {**device_class("empty"), "spec": {"selectors": [{}]}})
    assert _messages(refused) == ["spec.selectors[0].cel: Required value"]


async def test_a_selector_that_parses_but_does_not_type_check_is_refused_as_kube_apiserver_does(http: Http) -> None:
    # cel-go checks names, fields and types at compile time: these parse, yet kube-apiserver refuses them
    for expression, problem in (
        ("device.driverName == 'gpu.nvidia.com'", "undefined field 'driverName'"),
        ("device.attributes['gpu.nvidia.com'].productName.beginsWith('NVIDIA')",
         "undeclared reference to 'beginsWith'"),
        ("device.driver", "must evaluate to bool or the unknown type, not string"),
    ):
        status, refused = await http.call("POST", CLASSES, device_class("typo", expression))
        assert status == 422, refused
        (message,) = _messages(refused)
        assert message.startswith(f"spec.selectors[0].cel.expression: Invalid value: \"{expression}\": "
                                  "compilation failed: ERROR: <input>:1:"), message
        assert problem in message
