"""The devices a DRA driver publishes in its ResourceSlices, as typed values the allocator and the device
selectors read.

A slice's ``spec.devices`` entry (``resource.k8s.io/v1``; staging/src/k8s.io/api/resource/v1/types.go) becomes a
frozen :class:`SliceDevice`. Attribute and capacity names are qualified as the scheduler qualifies them
(k8s.io/dynamic-resource-allocation/cel/compile.go ``parseQualifiedName``): a name without a domain gets the
driver's, so the driver ``gpu.nvidia.com``'s ``productName`` is ``gpu.nvidia.com/productName`` here and
``device.attributes['gpu.nvidia.com'].productName`` in CEL. An attribute holds exactly one of ``bool``,
``int``, ``string``, ``version`` (or, since 1.36, one of the lists ``bools``/``ints``/``strings``/``versions``).

A slice is input from a driver, not truth we made: a malformed entry raises ValueError naming the device and
field, and the caller decides (skip the device, report the slice).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from deviceshare.core.dravalues import Quantity, Version

DeviceAttribute = (bool | int | str | Version
                   | tuple[bool, ...] | tuple[int, ...] | tuple[str, ...] | tuple[Version, ...])
"""One attribute's value, typed as DRA types it (a list-typed attribute is a tuple)."""

TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")
ATTRIBUTE_MAX_VALUE_LENGTH = 64  # DeviceAttributeMaxValueLength
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SCALARS = {"bool": bool, "int": int, "string": str, "version": Version}
_LISTS = {"bools": "bool", "ints": "int", "strings": "string", "versions": "version"}
_Value = TypeVar("_Value")  # an attribute's or a capacity's, as read


@dataclasses.dataclass(frozen=True, slots=True)
class CapacityRange:
    minimum: Quantity
    maximum: Quantity | None = None
    step: Quantity | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class CapacityRequestPolicy:
    """How a device that allows multiple allocations hands out this capacity (KEP-5075): a default request and
    either a list of valid values or a range."""

    default: Quantity | None = None
    valid_values: tuple[Quantity, ...] = ()
    valid_range: CapacityRange | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceCapacity:
    value: Quantity
    request_policy: CapacityRequestPolicy | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceTaint:
    key: str
    effect: str  # NoSchedule, NoExecute or None
    value: str = ""
    time_added: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class SliceDevice:
    """One device of a ResourceSlice. ``attributes`` and ``capacity`` are keyed by qualified name
    (``<domain>/<id>``); both mappings are read-only."""

    driver: str
    pool: str
    name: str
    attributes: Mapping[str, DeviceAttribute] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    capacity: Mapping[str, DeviceCapacity] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    allow_multiple_allocations: bool = False
    taints: tuple[DeviceTaint, ...] = ()
    binds_to_node: bool = False
    node_name: str | None = None  # only for a slice with perDeviceNodeSelection

    def __hash__(self) -> int:  # the mappings are not hashable; identity in the pool is enough for a hash
        return hash((self.driver, self.pool, self.name))

    @property
    def id(self) -> str:
        """``<driver>/<pool>/<device>``, as kube-scheduler's DeviceID prints."""
        return f"{self.driver}/{self.pool}/{self.name}"

    def attribute(self, name: str) -> DeviceAttribute | None:
        """An attribute by name, qualified or not (an unqualified name is the driver's)."""
        return self.attributes.get(qualify(name, self.driver))


def qualify(name: str, driver: str) -> str:
    """``productName`` -> ``<driver>/productName``; a qualified name stays as it is."""
    return name if "/" in name else f"{driver}/{name}"


def split_qualified(name: str) -> tuple[str, str]:
    """``<domain>/<id>`` -> (domain, id), splitting at the first ``/`` as parseQualifiedName does."""
    domain, _, ident = name.partition("/")
    return domain, ident


def slice_devices(resource_slice: Mapping[str, Any]) -> tuple[SliceDevice, ...]:
    """All devices of one ResourceSlice object; ValueError for the first malformed one."""
    spec = resource_slice.get("spec")
    if not isinstance(spec, Mapping):
        raise ValueError("spec: Required value")
    driver, pool = spec.get("driver"), spec.get("pool")
    if not isinstance(driver, str) or not driver:
        raise ValueError("spec.driver: Required value")
    if not isinstance(pool, Mapping) or not isinstance(pool.get("name"), str) or not pool["name"]:
        raise ValueError("spec.pool.name: Required value")
    devices = spec.get("devices") or []
    if not isinstance(devices, list):
        raise ValueError("spec.devices: must be a list")
    return tuple(parse_slice_device(driver, pool["name"], d) for d in devices)


def parse_slice_device(driver: str, pool: str, device: Mapping[str, Any]) -> SliceDevice:
    """One entry of a ResourceSlice's ``spec.devices`` (v1 field names) as a :class:`SliceDevice`.

    Cheap for the common shape (a restart folds every device of the cluster): an attribute written as one
    well-formed scalar, a capacity with only a ``value`` string, are read without building messages, their
    names, versions and capacities looked up in bounded caches (thousands of alike GPUs share them) and their
    strings interned. Anything else goes the checking way, which names the field that is wrong; both give the
    same values (tests/core/test_dra_devices_fast.py checks them against the reference reader).
    """
    if type(device) is not dict and not isinstance(device, Mapping):  # (an ABC's isinstance is slow: dict first)
        raise ValueError(f"device: must be an object, not {type(device).__name__}")
    name = device.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("device name: Required value")
    shared = device.get("allowMultipleAllocations") is True
    attributes = _entries(device.get("attributes"), name, "attributes", driver, _plain_attribute, _attribute)
    capacity = _entries(device.get("capacity"), name, "capacity", driver, _plain_capacity,
                        functools.partial(_capacity, shared=shared))
    raw_taints = device.get("taints")
    taints = () if raw_taints is None else tuple(
        _taint(t, f"device {name!r}: taints[{i}]") for i, t in enumerate(_list(raw_taints, f"device {name!r}: taints")))
    node_name = device.get("nodeName")
    return SliceDevice(
        driver=driver, pool=pool, name=sys.intern(name) if type(name) is str else name,
        attributes=types.MappingProxyType(attributes), capacity=types.MappingProxyType(capacity),
        allow_multiple_allocations=shared, taints=taints, binds_to_node=device.get("bindsToNode") is True,
        node_name=node_name if isinstance(node_name, str) and node_name else None,
    )


def _entries(
    raw: Any, device: str, field: str, driver: str,
    plain: Callable[[Any], _Value | None], checked: Callable[[Any, str], _Value],
) -> dict[str, _Value]:
    """A device's ``attributes`` or ``capacity`` by qualified name: each entry read the cheap way (``plain``, a
    cached name) where it has the common shape, else the checking way (``checked``: the same value, or the error
    naming the field)."""
    entries: dict[str, _Value] = {}
    for key, value in _fields(raw, device, field):
        qualified = _checked_name(key, driver) if type(key) is str else None
        parsed = plain(value)
        if qualified is None or parsed is None:
            where = f"device {device!r}: {field}[{key!r}]"
            qualified, parsed = _qualified_name(key, driver, where), checked(value, where)
        entries[qualified] = parsed
    return entries


# -- the common shapes, without messages ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _checked_name(key: str, driver: str) -> str | None:
    """``_qualified_name`` of a valid name (one string shared by every device that has it); None: not valid."""
    try:
        return _qualified_name(key, driver, "")
    except ValueError:
        return None


def _plain_attribute(raw: Any) -> DeviceAttribute | None:
    """An attribute that is one valid scalar (``{"string": "Hopper"}``) as ``_attribute`` reads it; None for any
    other shape (a list, two values, a wrong type: ``_attribute`` decides)."""
    if type(raw) is not dict or len(raw) != 1:
        return None
    for kind, value in raw.items():
        if kind == "string":
            return sys.intern(value) if type(value) is str and len(value) <= ATTRIBUTE_MAX_VALUE_LENGTH else None
        if kind == "int":
            return value if type(value) is int else None
        if kind == "bool":
            return value if type(value) is bool else None
        if kind == "version":
            return _version(value) if type(value) is str and len(value) <= ATTRIBUTE_MAX_VALUE_LENGTH else None
    return None


@functools.lru_cache(maxsize=4096)
def _version(text: str) -> Version | None:
    try:
        return Version.parse(text)
    except ValueError:
        return None


def _plain_capacity(raw: Any) -> DeviceCapacity | None:
    """A capacity that is only a valid ``value`` string, as ``_capacity`` reads it; None for any other shape."""
    if type(raw) is not dict or len(raw) != 1:
        return None
    value = raw.get("value")
    return _capacity_of(value) if type(value) is str else None


@functools.lru_cache(maxsize=4096)
def _capacity_of(text: str) -> DeviceCapacity | None:
    try:
        return DeviceCapacity(Quantity.parse(text))
    except ValueError:
        return None


# -- the checking way ------------------------------------------------------------------------------------------------


def _fields(value: Any, device: str, field: str) -> Iterable[tuple[Any, Any]]:
    """The entries of a device's ``attributes`` or ``capacity`` (its message built only when it is wrong)."""
    if type(value) is dict:
        return value.items()
    return () if value is None else _object(value, f"device {device!r}: {field}").items()


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
