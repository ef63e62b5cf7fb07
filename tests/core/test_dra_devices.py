"""A ResourceSlice's devices as typed values: names qualified as the scheduler qualifies them, DRA's four
attribute types (and their lists), capacities with their request policy, taints; bad input named."""

from __future__ import annotations

from fractions import Fraction

import pytest

from deviceshare.core import dradevices
from deviceshare.core.dravalues import Quantity, Version

SLICE = {
    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
    "spec": {
        "driver": "gpu.nvidia.com", "nodeName": "node-a", "pool": {"name": "node-a", "generation": 1,
                                                                    "resourceSliceCount": 1},
        "devices": [
            {"name": "gpu-0",
             "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}, "index": {"int": 0},
                            "driverVersion": {"version": "580.95.5"}, "mig": {"bool": False},
                            "numa.example.com/node": {"int": 1}, "links": {"strings": ["gpu-1", "gpu-2"]}},
             "capacity": {"memory": {"value": "80Gi"}}},
            {"name": "gpu-1", "allowMultipleAllocations": True,
             "capacity": {"memory": {"value": "40Gi", "requestPolicy": {
                 "default": "40Gi", "validRange": {"min": "1Gi", "step": "1Gi", "max": "40Gi"}}}},
             "taints": [{"key": "example.com/unhealthy", "value": "xid-79", "effect": "NoSchedule",
                         "timeAdded": "2026-11-27T10:00:00Z"}]},
        ],
    },
}


def test_a_slice_reads_as_typed_devices_with_qualified_names() -> None:
    gpu0, gpu1 = dradevices.slice_devices(SLICE)
    assert (gpu0.driver, gpu0.pool, gpu0.name, gpu0.id) == ("gpu.nvidia.com", "node-a", "gpu-0",
                                                            "gpu.nvidia.com/node-a/gpu-0")
    assert dict(gpu0.attributes) == {
        "gpu.nvidia.com/productName": "NVIDIA H100 80GB HBM3", "gpu.nvidia.com/index": 0,
        "gpu.nvidia.com/driverVersion": Version(580, 95, 5), "gpu.nvidia.com/mig": False,
        "numa.example.com/node": 1, "gpu.nvidia.com/links": ("gpu-1", "gpu-2"),
    }
    assert gpu0.attribute("productName") == gpu0.attribute("gpu.nvidia.com/productName") == "NVIDIA H100 80GB HBM3"
    assert gpu0.capacity["gpu.nvidia.com/memory"].value == Quantity(Fraction(80 * 2**30))
    assert gpu0.allow_multiple_allocations is False and gpu0.taints == ()
    policy = gpu1.capacity["gpu.nvidia.com/memory"].request_policy
    assert policy is not None and policy.default == Quantity.parse("40Gi")
    assert policy.valid_range == dradevices.CapacityRange(Quantity.parse("1Gi"), Quantity.parse("40Gi"),
                                                          Quantity.parse("1Gi"))
    assert gpu1.allow_multiple_allocations is True
    assert gpu1.taints == (dradevices.DeviceTaint("example.com/unhealthy", "NoSchedule", "xid-79",
                                                  "2026-11-27T10:00:00Z"),)


def test_devices_are_frozen_and_hashable() -> None:
    gpu0, gpu1 = dradevices.slice_devices(SLICE)
    assert len({gpu0, gpu1, dradevices.slice_devices(SLICE)[0]}) == 2
    with pytest.raises(TypeError):
        gpu0.attributes["gpu.nvidia.com/index"] = 3  # type: ignore[index]


@pytest.mark.parametrize("device,problem", [
    ({"attributes": {"a": {"int": 1}}}, "device name: Required value"),
    ({"name": "d", "attributes": {"a": {"int": 1, "string": "x"}}}, "attributes['a']: exactly one of"),
    ({"name": "d", "attributes": {"a": {}}}, "attributes['a']: exactly one of"),
    ({"name": "d", "attributes": {"a": {"int": "1"}}}, "attributes['a'].int: must be an integer"),
    ({"name": "d", "attributes": {"a": {"bool": 1}}}, "attributes['a'].bool: must be true or false"),
    ({"name": "d", "attributes": {"a": {"version": "1.0"}}}, "attributes['a'].version: '1.0' is not a semantic"),
    ({"name": "d", "attributes": {"a": {"string": "x" * 65}}}, "attributes['a'].string: longer than 64"),
    ({"name": "d", "attributes": {"a-b": {"int": 1}}}, "attributes['a-b']: 'a-b' is not a C identifier"),
    ({"name": "d", "attributes": {"Bad_Domain!/a": {"int": 1}}}, "domain 'Bad_Domain!' is not a DNS subdomain"),
    ({"name": "d", "capacity": {"memory": {}}}, "capacity['memory'].value: Required value"),
    ({"name": "d", "capacity": {"memory": {"value": "80 Gi"}}}, "capacity['memory'].value: '80 Gi' is not a quantity"),
    ({"name": "d", "capacity": {"memory": {"value": "8Gi", "requestPolicy": {"default": "1Gi"}}}},
     "requestPolicy: only a device with allowMultipleAllocations has one"),
    ({"name": "d", "taints": [{"key": "k", "effect": "Sometimes"}]}, "taints[0].effect: 'Sometimes' is not one of"),
    ({"name": "d", "attributes": ["a"]}, "attributes: must be an object, not list"),
])
def test_a_malformed_device_is_refused_naming_the_field(device: dict[str, object], problem: str) -> None:
    with pytest.raises(ValueError) as refused:
        dradevices.parse_slice_device("gpu.nvidia.com", "pool", device)
    assert problem in str(refused.value)


def test_a_slice_without_driver_or_pool_is_refused() -> None:
    with pytest.raises(ValueError, match=r"spec\.driver: Required"):
        dradevices.slice_devices({"spec": {"pool": {"name": "p"}}})
    with pytest.raises(ValueError, match=r"spec\.pool\.name: Required"):
        dradevices.slice_devices({"spec": {"driver": "d.example.com"}})
