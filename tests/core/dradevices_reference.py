"""The ResourceSlice device reader as it was before it was made cheap (``parse_slice_device`` of commit eae091e,
verbatim): every field through the checking helpers, a message built for each. ``test_dra_devices_fast.py`` holds
the fast reader to it. The checking helpers are the live module's (the fast reader falls back to them; what they
accept and refuse is pinned by ``test_dra_devices.py``), so what is compared is the fast path against them."""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

from deviceshare.core.dradevices import (
    DeviceAttribute,
    DeviceCapacity,
    SliceDevice,
    _attribute,
    _capacity,
    _list,
    _object,
    _qualified_name,
    _taint,
)


def parse_slice_device(driver: str, pool: str, device: Mapping[str, Any]) -> SliceDevice:
    """One entry of a ResourceSlice's ``spec.devices`` (v1 field names) as a :class:`SliceDevice`."""
    if not isinstance(device, Mapping):
        raise ValueError(f"device: must be an object, not {type(device).__name__}")
    name = device.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("device name: Required value")
    where = f"device {name!r}"
    attributes: dict[str, DeviceAttribute] = {}
    for key, raw in _object(device.get("attributes"), f"{where}: attributes").items():
        qualified = _qualified_name(key, driver, f"{where}: attributes[{key!r}]")
        attributes[qualified] = _attribute(raw, f"{where}: attributes[{key!r}]")
    capacity: dict[str, DeviceCapacity] = {}
    shared = device.get("allowMultipleAllocations") is True
    for key, raw in _object(device.get("capacity"), f"{where}: capacity").items():
        qualified = _qualified_name(key, driver, f"{where}: capacity[{key!r}]")
        capacity[qualified] = _capacity(raw, f"{where}: capacity[{key!r}]", shared=shared)
    taints = tuple(_taint(t, f"{where}: taints[{i}]") for i, t in enumerate(_list(device.get("taints"),
                                                                                   f"{where}: taints")))
    node_name = device.get("nodeName")
    return SliceDevice(
        driver=driver, pool=pool, name=name,
        attributes=types.MappingProxyType(attributes), capacity=types.MappingProxyType(capacity),
        allow_multiple_allocations=shared, taints=taints, binds_to_node=device.get("bindsToNode") is True,
        node_name=node_name if isinstance(node_name, str) and node_name else None,
    )
