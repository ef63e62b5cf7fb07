"""ResourceClaim (``resource.k8s.io/v1``): defaults, spec validation, and the rules of its status.

Read from kubernetes/kubernetes (2026):

- pkg/apis/resource/v1/defaults.go: a request's ``allocationMode`` defaults to ``ExactCount`` and, in that
  mode, ``count`` to 1 (``exactly`` and each ``firstAvailable`` subrequest); a toleration's operator to
  ``Equal``.
- pkg/registry/resource/resourceclaim/strategy.go: status dropped at create; a main write keeps the status,
  a ``/status`` write keeps the spec (the sandbox's generic registry already splits them so).
- pkg/apis/resource/validation/validation.go: ``ValidateResourceClaim`` (at most 32 requests, unique DNS-label
  names, exactly one of ``exactly`` / ``firstAvailable``, a class name, CEL selectors, ``count`` above zero
  for ``ExactCount`` and unset for ``All``), ``ValidateResourceClaimUpdate`` (the spec is immutable) and
  ``validateResourceClaimStatusUpdate``:
  ``reservedFor`` at most 256 entries, each with resource, name and uid, unique by uid; ``reservedFor``
  non-empty only with an allocation (so an allocation cannot be removed while anyone is reserved); no new
  entries while the claim is being deleted; an allocation is never changed once written, only removed
  (a new one is validated: at most 32 results, each naming a request of the claim, a driver, pool and
  device, ``shareID`` a lower-case UUID, and ``nodeSelector`` a valid node selector).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deviceshare.sandbox import dra
from deviceshare.sandbox.dra import Causes, listed, mapping

REQUESTS_MAX = RESULTS_MAX = 32
CONSTRAINTS_MAX = 32
SUBREQUESTS_MAX = 8
RESERVED_FOR_MAX = 256
EXACT_COUNT, ALL = "ExactCount", "All"
NOT_A_REQUEST = "must be the name of a request in the claim or the name of a request and a subrequest separated by '/'"


def prepare_for_create(claim: dict[str, Any]) -> None:
    """PrepareForCreate (status dropped) and the v1 defaults of every request."""
    claim.pop("status", None)
    default(claim)


def default(claim: dict[str, Any]) -> None:
    """SetDefaults_ExactDeviceRequest / SetDefaults_DeviceSubRequest / SetDefaults_DeviceToleration."""
    for request in listed(mapping(mapping(claim.get("spec")).get("devices")).get("requests")):
        if not isinstance(request, dict):
            continue
        for exact in [request.get("exactly"), *listed(request.get("firstAvailable"))]:
            if isinstance(exact, dict):
                exact.setdefault("allocationMode", EXACT_COUNT)
                if exact["allocationMode"] == EXACT_COUNT and not exact.get("count"):
                    exact["count"] = 1
                for toleration in listed(exact.get("tolerations")):
                    if isinstance(toleration, dict):
                        toleration.setdefault("operator", "Equal")


def validate(claim: Mapping[str, Any], old: Mapping[str, Any] | None) -> Causes:
    """A create is checked in full; an update keeps the spec and must follow the status rules."""
    if old is None:
        return validate_spec(mapping(claim.get("spec")))
    causes: Causes = []
    if mapping(claim.get("spec")) != mapping(old.get("spec")):
        causes.append(dra.immutable("spec", "object"))
    deleting = bool(mapping(claim.get("metadata")).get("deletionTimestamp"))
    return causes + validate_status(mapping(claim.get("status")), mapping(old.get("status")),
                                    deleting, request_names(claim))


# -- spec -----------------------------------------------------------------------------------------------------


def request_names(claim: Mapping[str, Any]) -> dict[str, set[str]]:
    """gatherRequestNames: each request's name -> the names of its subrequests."""
    names: dict[str, set[str]] = {}
    for request in listed(mapping(mapping(claim.get("spec")).get("devices")).get("requests")):
        subs = {str(mapping(s).get("name")) for s in listed(mapping(request).get("firstAvailable"))}
        names[str(mapping(request).get("name"))] = subs
    return names


def names_request(names: dict[str, set[str]], ref: Any) -> bool:
    """``<request>`` or ``<request>/<subrequest>`` naming one of the claim's."""
    if not isinstance(ref, str):
        return False
    main, _, sub = ref.partition("/")
    return main in names and (not sub or sub in names[main]) and ref.count("/") <= 1


def validate_spec(spec: Mapping[str, Any]) -> Causes:
    devices = mapping(spec.get("devices"))
    names = request_names({"spec": spec})
    causes = dra.each(listed(devices.get("requests")), REQUESTS_MAX, _request, "spec.devices.requests",
                      key=lambda r: str(mapping(r).get("name")))
    causes += dra.each(listed(devices.get("constraints")), CONSTRAINTS_MAX,
                       lambda c, path: _constraint(c, path, names), "spec.devices.constraints")
    causes += dra.each(listed(devices.get("config")), dra.CONFIG_MAX,
                       lambda c, path: _request_refs(c, path, names) + dra.opaque_config(c, path),
                       "spec.devices.config")
    return causes


def _request(item: Any, path: str) -> Causes:
    """validateDeviceRequest: a name and exactly one of ``exactly`` or ``firstAvailable``."""
    request = mapping(item)
    causes = dra.label_name(request.get("name"), f"{path}.name")
    exactly, first = request.get("exactly"), listed(request.get("firstAvailable"))
    one_of = "exactly one of `exactly` or `firstAvailable` is required"
    if exactly is None and not first:
        return [*causes, dra.required(path, one_of)]
    if exactly is not None and first:
        return [*causes, dra.invalid(path, None, f"{one_of}, but multiple fields are set")]
    if exactly is not None:
        return causes + _exact(exactly, f"{path}.exactly")

    def subrequest(sub: Any, sub_path: str) -> Causes:
        return dra.label_name(mapping(sub).get("name"), f"{sub_path}.name") + _exact(sub, sub_path)

    return causes + dra.each(first, SUBREQUESTS_MAX, subrequest, f"{path}.firstAvailable",
                             key=lambda s: str(mapping(s).get("name")))


def _exact(item: Any, path: str) -> Causes:
    """validateExactDeviceRequest: class, selectors, allocation mode and count, capacity, tolerations."""
    exact = mapping(item)
    causes = dra.subdomain(exact.get("deviceClassName"), f"{path}.deviceClassName")
    causes += dra.each(listed(exact.get("selectors")), dra.SELECTORS_MAX, dra.selector, f"{path}.selectors")
    mode, count = exact.get("allocationMode"), exact.get("count", 0)
    if mode == ALL:
        if count:
            causes.append(dra.invalid(f"{path}.count", count, "must not be specified when allocationMode is 'All'"))
    elif mode == EXACT_COUNT:
        if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
            causes.append(dra.invalid(f"{path}.count", count, "must be greater than zero"))
    else:
        causes.append(dra.unsupported(f"{path}.allocationMode", mode, (ALL, EXACT_COUNT)))
    for name in mapping(mapping(exact.get("capacity")).get("requests")):
        causes += dra.qualified_name(name, f"{path}.capacity.requests")
    for i, toleration in enumerate(listed(exact.get("tolerations"))):
        causes += _toleration(toleration, f"{path}.tolerations[{i}]")
    return causes


def _toleration(item: Any, path: str) -> Causes:
    """validateDeviceToleration: operator ``Exists`` (no value) or ``Equal``; a known effect if any."""
    toleration = mapping(item)
    causes = dra.label_key(toleration["key"], f"{path}.key") if toleration.get("key") else []
    operator = toleration.get("operator")
    if operator == "Exists" and toleration.get("value"):
        causes.append(dra.invalid(f"{path}.value", toleration["value"], "must be empty for operator `Exists`"))
    elif operator not in ("Equal", "Exists"):
        causes.append(dra.unsupported(f"{path}.operator", operator, ("Equal", "Exists")))
    if toleration.get("effect") and toleration["effect"] not in dra.TAINT_EFFECTS:
        causes.append(dra.unsupported(f"{path}.effect", toleration["effect"], dra.TAINT_EFFECTS))
    return causes


def _request_refs(item: Any, path: str, names: dict[str, set[str]]) -> Causes:
    causes: Causes = []
    for i, ref in enumerate(listed(mapping(item).get("requests"))):
        if not names_request(names, ref):
            causes.append(dra.invalid(f"{path}.requests[{i}]", ref, NOT_A_REQUEST))
    return causes


def _constraint(item: Any, path: str, names: dict[str, set[str]]) -> Causes:
    constraint = mapping(item)
    causes = _request_refs(item, path, names)
    if not constraint.get("matchAttribute") and not constraint.get("distinctAttribute"):
        causes.append(dra.required(f"{path}.matchAttribute"))
    return causes


# -- status ---------------------------------------------------------------------------------------------------


def validate_status(
    status: Mapping[str, Any], old_status: Mapping[str, Any], deleting: bool, names: dict[str, set[str]]
) -> Causes:
    """validateResourceClaimStatusUpdate."""
    reserved = listed(status.get("reservedFor"))
    causes = dra.each(reserved, RESERVED_FOR_MAX, _consumer, "status.reservedFor",
                      key=lambda c: str(mapping(c).get("uid")))
    allocation, old_allocation = status.get("allocation"), old_status.get("allocation")
    if reserved:
        if allocation is None:
            causes.append(dra.forbidden("status.reservedFor", "may not be specified when `allocated` is not set"))
        elif deleting:
            before = {str(mapping(c).get("uid")) for c in listed(old_status.get("reservedFor"))}
            if any(str(mapping(c).get("uid")) not in before for c in reserved):
                causes.append(dra.forbidden("status.reservedFor", "new entries may not be added while "
                                            "`deallocationRequested` or `deletionTimestamp` are set"))
    if allocation is not None and old_allocation is not None:
        if allocation != old_allocation:
            causes.append(dra.immutable("status.allocation", "object"))
    elif allocation is not None:
        causes += _allocation(allocation, names)
    return causes


def _consumer(item: Any, path: str) -> Causes:
    """validateResourceClaimUserReference: resource, name and uid required (``apiGroup`` empty for pods)."""
    consumer = mapping(item)
    return [dra.required(f"{path}.{field}") for field in ("resource", "name", "uid") if not consumer.get(field)]


def _allocation(value: Any, names: dict[str, set[str]]) -> Causes:
    """validateAllocationResult, for a newly written allocation."""
    allocation, path = mapping(value), "status.allocation"
    results = listed(mapping(allocation.get("devices")).get("results"))
    causes = dra.each(results, RESULTS_MAX, lambda r, p: _result(r, p, names), f"{path}.devices.results")
    if allocation.get("nodeSelector") is not None:
        causes += dra.node_selector(allocation["nodeSelector"], f"{path}.nodeSelector")
    return causes


def _result(item: Any, path: str, names: dict[str, set[str]]) -> Causes:
    """validateDeviceRequestAllocationResult: request, driver, pool, device, and ``shareID`` if any."""
    result = mapping(item)
    causes: Causes = []
    if not names_request(names, result.get("request")):
        causes.append(dra.invalid(f"{path}.request", result.get("request"), NOT_A_REQUEST))
    causes += dra.driver_name(result.get("driver"), f"{path}.driver")
    causes += dra.pool_name(result.get("pool"), f"{path}.pool")
    causes += dra.label_name(result.get("device"), f"{path}.device")
    if result.get("shareID") is not None:
        causes += dra.uid(result["shareID"], f"{path}.shareID")
    for name in mapping(result.get("consumedCapacity")):
        causes += dra.qualified_name(name, f"{path}.consumedCapacity")
    return causes
