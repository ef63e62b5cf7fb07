"""DeviceClass and ResourceSlice validation (``resource.k8s.io/v1``), as kube-apiserver's
pkg/apis/resource/validation/validation.go has it (``ValidateDeviceClass``, ``ValidateResourceSlice(Update)``);
the shared field checks and their wording are in ``dra.py``."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from deviceshare.sandbox import dra
from deviceshare.sandbox.dra import (
    Causes,
    forbidden,
    immutable,
    invalid,
    label_key,
    label_name,
    listed,
    mapping,
    qualified_name,
    required,
    subdomain,
    unsupported,
)


def default_slice(obj: dict[str, Any]) -> None:
    """SetDefaults_DeviceTaint (pkg/apis/resource/v1/defaults.go): a taint written without ``timeAdded`` gets
    the time of the write, to the second."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for device in listed(mapping(obj.get("spec")).get("devices")):
        for taint in listed(mapping(device).get("taints")):
            if isinstance(taint, dict) and not taint.get("timeAdded"):
                taint["timeAdded"] = now


# -- DeviceClass --------------------------------------------------------------------------------------------------


def validate_device_class(obj: Mapping[str, Any]) -> Causes:
    spec = mapping(obj.get("spec"))
    causes = dra.each(listed(spec.get("selectors")), dra.SELECTORS_MAX, dra.selector, "spec.selectors")
    causes += dra.each(listed(spec.get("config")), dra.CONFIG_MAX, dra.opaque_config, "spec.config")
    return causes


# -- ResourceSlice ------------------------------------------------------------------------------------------------


def validate_resource_slice(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> Causes:
    spec, old_spec = mapping(obj.get("spec")), mapping((old or {}).get("spec"))
    causes = dra.driver_name(spec.get("driver"), "spec.driver")
    pool = mapping(spec.get("pool"))
    causes += dra.pool_name(pool.get("name"), "spec.pool.name")
    count, generation = pool.get("resourceSliceCount", 0), pool.get("generation", 0)
    if not isinstance(count, int) or count <= 0:
        causes.append(invalid("spec.pool.resourceSliceCount", count, "must be greater than zero"))
    if not isinstance(generation, int) or generation < 0:
        causes.append(invalid("spec.pool.generation", generation, "must be greater than or equal to zero"))
    if old is not None:
        for path, new_value, old_value in (
            ("spec.pool.name", pool.get("name"), mapping(old_spec.get("pool")).get("name")),
            ("spec.driver", spec.get("driver"), old_spec.get("driver")),
            ("spec.nodeName", spec.get("nodeName"), old_spec.get("nodeName")),
        ):
            if new_value != old_value:
                causes.append(immutable(path, new_value))
    causes += _node_selection(spec)
    devices = listed(spec.get("devices"))
    if devices and spec.get("sharedCounters"):
        causes.append(invalid("spec", "", "only one of `sharedCounters` or `devices` is allowed"))
    tainted = any(mapping(d).get("taints") for d in devices)
    limit = dra.SLICE_MAX_DEVICES_WITH_TAINTS if tainted else dra.SLICE_MAX_DEVICES
    causes += dra.each(devices, limit, device, "spec.devices", key=lambda d: str(mapping(d).get("name")))
    return causes


def _node_selection(spec: Mapping[str, Any]) -> Causes:
    causes: Causes = []
    chosen: list[str] = []
    if "nodeName" in spec:
        if spec["nodeName"]:
            chosen.append("`nodeName`")
            causes += subdomain(spec["nodeName"], "spec.nodeName")
        else:
            causes.append(invalid("spec.nodeName", spec["nodeName"],
                                  "must be either unset or set to a non-empty string"))
    if spec.get("nodeSelector") is not None:
        chosen.append("`nodeSelector`")
        causes += dra.node_selector(spec["nodeSelector"], "spec.nodeSelector")
        terms = listed(mapping(spec["nodeSelector"]).get("nodeSelectorTerms"))
        if len(terms) != 1:
            causes.append(invalid("spec.nodeSelector.nodeSelectorTerms", "object",
                                  "must have exactly one node selector term"))
    for flag in ("allNodes", "perDeviceNodeSelection"):
        if flag in spec and spec[flag] is not None:
            if spec[flag] is True:
                chosen.append(f"`{flag}`")
            else:
                causes.append(invalid(f"spec.{flag}", spec[flag], "must be either unset or set to true"))
    one_of = "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
    if not chosen:
        causes.append(required("spec", one_of))
    elif len(chosen) > 1:
        causes.append(invalid("spec", "{" + ", ".join(chosen) + "}", f"{one_of}, but multiple fields are set"))
    return causes


def device(item: Any, path: str) -> Causes:
    """validateDevice: name, attributes, capacity (``requestPolicy`` only when shared), taints."""
    dev = mapping(item)
    causes = label_name(dev.get("name"), f"{path}.name")
    attributes, capacity = mapping(dev.get("attributes")), mapping(dev.get("capacity"))
    total = len(attributes) + len(capacity)
    if total > dra.MAX_ATTRIBUTES_AND_CAPACITIES:
        causes.append(invalid(path, total, "the total number of attributes and capacities must not exceed "
                                           f"{dra.MAX_ATTRIBUTES_AND_CAPACITIES}"))
    for name, value in attributes.items():
        causes += qualified_name(name, f"{path}.attributes")
        causes += attribute(value, f"{path}.attributes[{name}]")
    shared = dev.get("allowMultipleAllocations") is True
    for name, value in capacity.items():
        causes += qualified_name(name, f"{path}.capacity")
        if not isinstance(mapping(value).get("value"), str | int):
            causes.append(required(f"{path}.capacity[{name}].value"))
        if mapping(value).get("requestPolicy") is not None and not shared:
            causes.append(forbidden(f"{path}.capacity[{name}].requestPolicy", "allowMultipleAllocations must be true"))
    causes += dra.each(listed(dev.get("taints")), dra.MAX_TAINTS, taint, f"{path}.taints")
    return causes


def attribute(value: Any, path: str) -> Causes:
    """validateDeviceAttribute: exactly one of ``int``, ``bool``, ``string``, ``version`` (or their lists)."""
    attr = mapping(value)
    present = [k for k in ("int", "bool", "string", "version", "ints", "bools", "strings", "versions") if k in attr]
    causes: Causes = []
    for key in ("string", "version"):
        text = attr.get(key)
        if key in attr and isinstance(text, str) and len(text) > dra.ATTRIBUTE_MAX_VALUE_LENGTH:
            causes.append((f"{path}.{key}", f"Too long: may not be more than {dra.ATTRIBUTE_MAX_VALUE_LENGTH} bytes"))
    if "version" in attr and not (isinstance(attr["version"], str) and dra.SEMVER.match(attr["version"])):
        causes.append(invalid(f"{path}.version", attr["version"],
                              "must be a string compatible with semver.org spec 2.0.0"))
    if len(present) != 1:
        causes.append(invalid(path, "" if not present else "object", "exactly one value must be specified"))
    return causes


def taint(item: Any, path: str) -> Causes:
    """validateDeviceTaint: a label-name key, an effect among None / NoSchedule / NoExecute."""
    t = mapping(item)
    causes = label_key(t.get("key"), f"{path}.key")
    effect = t.get("effect")
    if not effect:
        causes.append(required(f"{path}.effect"))
    elif effect not in dra.TAINT_EFFECTS:
        causes.append(unsupported(f"{path}.effect", effect, dra.TAINT_EFFECTS))
    return causes
