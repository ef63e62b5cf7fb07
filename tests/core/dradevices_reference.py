"""The ResourceSlice device reader as it was before it was made cheap (``core/dradevices.py`` of commit eae091e,
its checking path verbatim): the reference that ``test_dra_devices_fast.py`` holds the fast reader to. It builds
the live module's value types, so the two readers' answers compare field by field."""


from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

from deviceshare.core.dradevices import (
    _C_IDENTIFIER,
    _LISTS,
    _SCALARS,
    _SUBDOMAIN,
    ATTRIBUTE_MAX_VALUE_LENGTH,
    TAINT_EFFECTS,
    CapacityRange,
    CapacityRequestPolicy,
    DeviceAttribute,
    DeviceCapacity,
    DeviceTaint,
    SliceDevice,
)
from deviceshare.core.dravalues import Quantity, Version


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


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: must be an object, not {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{where}: must be a list, not {type(value).__name__}")
    return value


def _qualified_name(key: str, driver: str, where: str) -> str:
    domain, _, ident = key.rpartition("/") if "/" in key else (driver, "", key)
    if "/" in domain:
        raise ValueError(f"{where}: a name has at most one '/'")
    if not domain or len(domain) > 63 or not _SUBDOMAIN.match(domain.lower()):
        raise ValueError(f"{where}: domain {domain!r} is not a DNS subdomain of at most 63 characters")
    if len(ident) > 32 or not _C_IDENTIFIER.match(ident):
        raise ValueError(f"{where}: {ident!r} is not a C identifier of at most 32 characters")
    return f"{domain}/{ident}"


def _attribute(raw: Any, where: str) -> DeviceAttribute:
    attr = _object(raw, where)
    present = [k for k in (*_SCALARS, *_LISTS) if k in attr]
    if len(present) != 1:
        raise ValueError(f"{where}: exactly one of bool, int, string, version (or bools, ints, strings, versions) "
                         f"must be set, found {present or 'none'}")
    kind = present[0]
    if kind in _LISTS:
        items = _list(attr[kind], f"{where}.{kind}")
        return tuple(_scalar(_LISTS[kind], v, f"{where}.{kind}[{i}]") for i, v in enumerate(items))  # type: ignore[return-value]
    return _scalar(kind, attr[kind], f"{where}.{kind}")


def _scalar(kind: str, value: Any, where: str) -> bool | int | str | Version:
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{where}: must be true or false, not {value!r}")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: must be an integer, not {value!r}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"{where}: must be a string, not {value!r}")
    if len(value) > ATTRIBUTE_MAX_VALUE_LENGTH:
        raise ValueError(f"{where}: longer than {ATTRIBUTE_MAX_VALUE_LENGTH} characters")
    if kind == "version":
        try:
            return Version.parse(value)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    return value


def _quantity(value: Any, where: str) -> Quantity:
    try:
        return Quantity.parse(value)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _capacity(raw: Any, where: str, *, shared: bool) -> DeviceCapacity:
    cap = _object(raw, where)
    if "value" not in cap:
        raise ValueError(f"{where}.value: Required value")
    value = _quantity(cap["value"], f"{where}.value")
    policy_raw = cap.get("requestPolicy")
    if policy_raw is None:
        return DeviceCapacity(value)
    if not shared:
        raise ValueError(f"{where}.requestPolicy: only a device with allowMultipleAllocations has one")
    policy = _object(policy_raw, f"{where}.requestPolicy")
    default = _quantity(policy["default"], f"{where}.requestPolicy.default") if policy.get("default") is not None \
        else None
    values = tuple(_quantity(v, f"{where}.requestPolicy.validValues[{i}]")
                   for i, v in enumerate(_list(policy.get("validValues"), f"{where}.requestPolicy.validValues")))
    valid_range = None
    if policy.get("validRange") is not None:
        r = _object(policy["validRange"], f"{where}.requestPolicy.validRange")
        if r.get("min") is None:
            raise ValueError(f"{where}.requestPolicy.validRange.min: Required value")
        valid_range = CapacityRange(
            _quantity(r["min"], f"{where}.requestPolicy.validRange.min"),
            _quantity(r["max"], f"{where}.requestPolicy.validRange.max") if r.get("max") is not None else None,
            _quantity(r["step"], f"{where}.requestPolicy.validRange.step") if r.get("step") is not None else None,
        )
    if values and valid_range is not None:
        raise ValueError(f"{where}.requestPolicy: only one of validValues and validRange may be set")
    return DeviceCapacity(value, CapacityRequestPolicy(default, values, valid_range))


def _taint(raw: Any, where: str) -> DeviceTaint:
    taint = _object(raw, where)
    key, effect = taint.get("key"), taint.get("effect")
    if not isinstance(key, str) or not key:
        raise ValueError(f"{where}.key: Required value")
    if effect not in TAINT_EFFECTS:
        raise ValueError(f"{where}.effect: {effect!r} is not one of {', '.join(TAINT_EFFECTS)}")
    value, added = taint.get("value", ""), taint.get("timeAdded")
    return DeviceTaint(key, effect, value if isinstance(value, str) else "", added if isinstance(added, str) else None)
