"""What the DRA inventory (``drainventory.py``) reads from each ``resource.k8s.io/v1`` object: a ResourceSlice's
devices (typed by ``core.dradevices``, plus what the ledger needs: taints, ``allowMultipleAllocations``, memory),
a DeviceClass's compiled selectors and ``extendedResourceName``, a ResourceClaim's allocation and owner. Reading
never raises: a device that cannot be read matches no class, selectors that do not compile match nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Mapping
from typing import Any

from deviceshare.api import names, quantities
from deviceshare.core import deviceselectors, dradevices

logger = logging.getLogger(__name__)

GroupKey = tuple[str, str]
ClaimKey = tuple[str, str]
_FILTERED_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
GROUP_KIND = "SharedDeviceGroup"


def _mapping(value: object) -> Mapping[str, Any]:
    if type(value) is dict:  # what JSON decodes to; an ABC's isinstance costs more than the rest of a device's read
        return value
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _meta(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(body.get("metadata"))


def device_id(pool: str, device: str) -> str:
    """A DRA device's ID in the ledger and in a group's ``allocatedDevices``: ``<pool>/<device>``."""
    return f"{pool}/{device}"


@dataclasses.dataclass(frozen=True, slots=True)
class SliceDevice:
    """One device of a node's slice, as the inventory keeps it."""

    id: str  # <pool>/<device>
    driver: str
    pool: str
    name: str
    tainted: bool  # a NoSchedule / NoExecute taint
    shared: bool  # allowMultipleAllocations
    parsed: dradevices.SliceDevice | None  # None: the device could not be read (no class matches it)
    memory_bytes: int | None = None  # its capacity ``memory``, if it publishes one


@dataclasses.dataclass(frozen=True, slots=True)
class ResourceSlice:
    name: str
    version: str
    node: str | None  # spec.nodeName; None for nodeSelector / allNodes / perDeviceNodeSelection slices
    driver: str
    pool: str
    generation: int
    devices: tuple[SliceDevice, ...]


@dataclasses.dataclass(frozen=True)
class DeviceClass:
    name: str
    selectors: deviceselectors.Selectors | None  # None: they do not compile (the class matches nothing)
    extended_resource: str | None


@dataclasses.dataclass(frozen=True)
class ClaimAllocation:
    """A claim's allocation as the inventory needs it."""

    key: ClaimKey
    uid: str
    owner: GroupKey | None  # the SharedDeviceGroup controlling it, if any (only its name: see ``ours``)
    owner_uid: str  # that group's uid in the controller reference ("" if none): a rebuild trusts only a match
    devices: frozenset[str]  # <pool>/<device> of every result
    shared: frozenset[str]  # the results with a shareID (a share of a device that allows several allocations)


def read_slice(body: Mapping[str, Any]) -> ResourceSlice:
    meta, spec = _meta(body), _mapping(body.get("spec"))
    driver = sys.intern(str(spec.get("driver") or ""))  # one string for the driver's devices on every node
    pool_spec = _mapping(spec.get("pool"))
    pool = str(pool_spec.get("name") or "")
    devices: list[SliceDevice] = []
    for raw in _list(spec.get("devices")):
        raw = _mapping(raw)
        name = str(raw.get("name") or "")
        try:
            parsed: dradevices.SliceDevice | None = dradevices.parse_slice_device(driver, pool, raw)
        except ValueError as e:
            logger.warning("ResourceSlice %s: device %s cannot be read: %s", meta.get("name"), name, e)
            parsed = None
        taints = raw.get("taints")
        tainted = taints is not None and any(_mapping(t).get("effect") in _FILTERED_EFFECTS for t in _list(taints))
        devices.append(SliceDevice(device_id(pool, name), driver, pool, name, tainted,
                                   raw.get("allowMultipleAllocations") is True, parsed, _memory(raw)))
    node = spec.get("nodeName")
    generation = pool_spec.get("generation")
    return ResourceSlice(
        name=str(meta.get("name") or ""), version=str(meta.get("resourceVersion") or ""),
        node=str(node) if node else None, driver=driver, pool=pool,
        generation=generation if isinstance(generation, int) else 0, devices=tuple(devices),
    )


def _memory(device: Mapping[str, Any]) -> int | None:
    value = _mapping(_mapping(device.get("capacity")).get("memory")).get("value")
    try:
        return quantities.parse_bytes(value) if isinstance(value, str | int) else None
    except ValueError:
        return None


def read_class(body: Mapping[str, Any]) -> DeviceClass:
    spec = _mapping(body.get("spec"))
    expressions = [str(_mapping(_mapping(s).get("cel")).get("expression") or "") for s in _list(spec.get("selectors"))]
    name = str(_meta(body).get("name") or "")
    try:
        selectors: deviceselectors.Selectors | None = deviceselectors.compile_selectors(expressions)
    except deviceselectors.SelectorError as e:
        logger.warning("DeviceClass %s: its selectors do not compile, it offers no device: %s", name, e)
        selectors = None
    extended = spec.get("extendedResourceName")
    return DeviceClass(name, selectors, str(extended) if extended else None)


def read_claim(body: Mapping[str, Any]) -> ClaimAllocation | None:
    """The claim's allocation; None when it has none."""
    meta = _meta(body)
    allocation = _mapping(body.get("status")).get("allocation")
    if not isinstance(allocation, Mapping):
        return None
    results = [_mapping(r) for r in _list(_mapping(allocation.get("devices")).get("results"))]
    controller = next((_mapping(ref) for ref in _list(meta.get("ownerReferences"))
                       if _mapping(ref).get("controller") and _mapping(ref).get("kind") == GROUP_KIND
                       and str(_mapping(ref).get("apiVersion", "")).startswith(names.GROUP + "/")), None)
    owner = str(controller.get("name")) if controller is not None else None
    key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
    return ClaimAllocation(
        key=key, uid=str(meta.get("uid") or ""),
        owner=(key[0], owner) if owner else None,
        owner_uid=str(controller.get("uid") or "") if controller is not None else "",
        devices=frozenset(device_id(str(r.get("pool")), str(r.get("device"))) for r in results),
        shared=frozenset(device_id(str(r.get("pool")), str(r.get("device"))) for r in results if r.get("shareID")),
    )


class ClaimBodies:
    """Our groups' claims as we last read or wrote them (group -> body): the members of a gang bound in one cycle
    cost one read of their claim, not one each. Replaced with the inventory at each term."""

    def __init__(self) -> None:
        self._bodies: dict[GroupKey, dict[str, Any]] = {}

    def get(self, group: GroupKey) -> dict[str, Any] | None:
        return self._bodies.get(group)

    def keep(self, group: GroupKey, body: dict[str, Any] | None) -> dict[str, Any] | None:
        if body is None:
            self._bodies.pop(group, None)
        else:
            self._bodies[group] = body
        return body

    def forget(self, group: GroupKey) -> None:
        self._bodies.pop(group, None)
