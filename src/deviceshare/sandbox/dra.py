"""``resource.k8s.io/v1`` (Dynamic Resource Allocation): the kinds the sandbox serves and the field checks that
DeviceClass and ResourceSlice validation (``draslices.py``) and the ResourceClaim rules (``claims.py``) share.

What kube-apiserver does, read from (kubernetes/kubernetes, 2026):

- staging/src/k8s.io/api/resource/v1/types.go: the field names and limits (128 devices per slice, 64 when a
  device has taints; 32 attributes and capacities per device; 64-character attribute values; 16 taints; pool
  names up to 253 characters of DNS subdomains joined by ``/``).
- pkg/apis/resource/validation/validation.go: ``ValidateDeviceClass``, ``ValidateResourceSlice(Update)``
  (driver, pool, exactly one of ``nodeName`` / ``nodeSelector`` / ``allNodes`` / ``perDeviceNodeSelection``,
  one node selector term, devices unique by name, attributes with exactly one value, ``requestPolicy`` only
  on a device that ``allowMultipleAllocations``, taint effects ``None`` / ``NoSchedule`` / ``NoExecute``;
  ``driver``, ``pool.name`` and ``nodeName`` immutable). Messages follow its ``field.Error`` wording.
- pkg/registry/resource/resourceslice/strategy.go: slices are selectable by ``spec.nodeName`` and
  ``spec.driver``.

Selectors compile with the operator's own engine (core/deviceselectors.py: kube-scheduler's DRA CEL environment,
type checks included), so the sandbox refuses what kube-apiserver refuses and the operator runs what it accepts.

Not modelled: CEL cost limits, ``sharedCounters`` /
``consumesCounters`` beyond their presence, binding conditions, ``nodeAllocatableResources``, and
DeviceTaintRule / ResourceClaimTemplate.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from deviceshare.core import deviceselectors

GROUP, VERSION = "resource.k8s.io", "v1"
API_VERSION = f"{GROUP}/{VERSION}"
DEVICE_CLASSES, RESOURCE_SLICES, RESOURCE_CLAIMS = (
    (GROUP, "deviceclasses"), (GROUP, "resourceslices"), (GROUP, "resourceclaims"))
KEYS = frozenset({DEVICE_CLASSES, RESOURCE_SLICES, RESOURCE_CLAIMS})

SLICE_MAX_DEVICES, SLICE_MAX_DEVICES_WITH_TAINTS = 128, 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
ATTRIBUTE_MAX_VALUE_LENGTH = 64
MAX_TAINTS = 16
SELECTORS_MAX, CONFIG_MAX = 32, 32
CEL_MAX_LENGTH = 10 * 1024
TAINT_EFFECTS = ("NoExecute", "NoSchedule", "None")

Causes = list[tuple[str, str]]
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_QUALIFIED_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?"
    r"(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?$"
)
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_T = TypeVar("_T")


# -- field.Error wording --------------------------------------------------------------------------------------


def quoted(value: Any) -> str:
    """A bad value as ``field.Error`` prints it: strings quoted, numbers and booleans bare, nil as null; an object
    as ``"object"`` (kube-apiserver prints the Go value there, e.g. ``resource.ResourceClaimSpec{...}``)."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return '"' + value.replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, int | float) else '"object"'


def required(path: str, detail: str = "") -> tuple[str, str]:
    return (path, f"Required value: {detail}" if detail else "Required value")


def invalid(path: str, value: Any, detail: str) -> tuple[str, str]:
    return (path, f"Invalid value: {quoted(value)}: {detail}")


def forbidden(path: str, detail: str) -> tuple[str, str]:
    return (path, f"Forbidden: {detail}")


def too_many(path: str, count: int, limit: int) -> tuple[str, str]:
    return (path, f"Too many: {count}: must have at most {limit} items")


def duplicate(path: str, value: Any) -> tuple[str, str]:
    return (path, f"Duplicate value: {quoted(value)}")


def unsupported(path: str, value: Any, supported: Iterable[str]) -> tuple[str, str]:
    listed = ", ".join(f'"{s}"' for s in supported)
    return (path, f"Unsupported value: {quoted(value)}: supported values: {listed}")


def immutable(path: str, value: Any) -> tuple[str, str]:
    return invalid(path, value, "field is immutable")


# -- shapes of JSON values -------------------------------------------------------------------------------------


def mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def each(
    items: Sequence[_T], limit: int, check: Callable[[_T, str], Causes], path: str,
    key: Callable[[_T], Hashable] | None = None,
) -> Causes:
    """validateSlice / validateSet: too many items is the only error (a DoS guard), else each item's errors
    and, for a set, a ``Duplicate value`` for every repeated key."""
    if 0 <= limit < len(items):
        return [too_many(path, len(items), limit)]
    causes: Causes = []
    seen: set[Hashable] = set()
    for i, item in enumerate(items):
        causes += check(item, f"{path}[{i}]")
        if key is not None:
            k = key(item)
            if k in seen:
                causes.append(duplicate(f"{path}[{i}]", k))
            seen.add(k)
    return causes


# -- names --------------------------------------------------------------------------------------------------------


def label_name(value: Any, path: str) -> Causes:
    """A DNS-1123 label (device and request names): ValidateDNS1123Label."""
    if not isinstance(value, str) or not value:
        return [required(path)]
    if len(value) > 63 or not _LABEL.match(value):
        return [invalid(path, value, "a lowercase RFC 1123 label must consist of lower case alphanumeric "
                                     "characters or '-', and must start and end with an alphanumeric character")]
    return []


def subdomain(value: Any, path: str) -> Causes:
    """A DNS-1123 subdomain (class, node and pool names): ValidateDNS1123Subdomain."""
    if not isinstance(value, str) or not value:
        return [required(path)]
    if len(value) > 253 or not _SUBDOMAIN.match(value):
        return [invalid(path, value, "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                                     "characters, '-' or '.', and must start and end with an alphanumeric character")]
    return []


def driver_name(value: Any, path: str) -> Causes:
    """ValidateCSIDriverName: required, at most 63 bytes, a DNS subdomain once lower-cased."""
    if not isinstance(value, str) or not value:
        return [required(path)]
    if len(value) > 63:
        return [(path, "Too long: may not be more than 63 bytes")]
    return [invalid(path, value, detail.split(": ", 2)[-1]) for _, detail in subdomain(value.lower(), path)]


def pool_name(value: Any, path: str) -> Causes:
    """validatePoolName: required, at most 253 characters, DNS subdomains separated by ``/``."""
    if not isinstance(value, str) or not value:
        return [required(path)]
    if len(value) > 253:
        return [(path, "Too long: may not be more than 253 bytes")]
    return [cause for part in value.split("/") for cause in subdomain(part, path)]


def qualified_name(name: str, path: str) -> Causes:
    """validateQualifiedName: a C identifier (at most 32) or ``<domain>/<C identifier>``."""
    parts = name.split("/")
    if len(parts) > 2:
        return [invalid(path, name, "must not contain more than one slash")]
    causes: Causes = []
    if len(parts) == 2:
        domain, name = parts
        causes += driver_name(domain, path) if domain else [invalid(path, "", "the domain must not be empty")]
        if not name:
            return [*causes, invalid(path, "", "the name must not be empty")]
    if len(name) > 32:
        causes.append((path, "Too long: may not be more than 32 bytes"))
    if not _C_IDENTIFIER.match(name):
        causes.append(invalid(path, name, "a valid C identifier must start with alphabetic character or '_', "
                                          "followed by a string of alphanumeric characters or '_'"))
    return causes


def uid(value: Any, path: str) -> Causes:
    if not isinstance(value, str) or not _UUID.match(value):
        return [invalid(path, value, "uid must be in RFC 4122 normalized form, "
                                     "`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` with lowercase hexadecimal characters")]
    return []


def label_key(value: Any, path: str) -> Causes:
    """metav1validation.ValidateLabelName: an optional DNS-subdomain prefix and a name of at most 63."""
    if not isinstance(value, str) or not value:
        return [required(path)]
    prefix, _, name = value.rpartition("/")
    if (prefix and subdomain(prefix, path)) or len(name) > 63 or not _QUALIFIED_LABEL_NAME.match(name):
        return [invalid(path, value, "name part must consist of alphanumeric characters, '-', '_' or '.', "
                                     "and must start and end with an alphanumeric character")]
    return []


# -- CEL selectors and node selectors ---------------------------------------------------------------------------


def selector(item: Any, path: str) -> Causes:
    """validateSelector: ``cel`` required; its expression at most 10 KiB and compiling in the DRA environment."""
    expression = mapping(mapping(item).get("cel")).get("expression")
    if not isinstance(mapping(item).get("cel"), Mapping):
        return [required(f"{path}.cel")]
    path = f"{path}.cel.expression"
    if not isinstance(expression, str) or not expression:
        return [required(path)]
    if len(expression) > CEL_MAX_LENGTH:
        return [(path, f"Too long: may not be more than {CEL_MAX_LENGTH} bytes")]
    try:
        deviceselectors.compile_selectors([expression])
    except deviceselectors.SelectorError as e:
        return [invalid(path, expression, e.detail)]
    return []


def node_selector(value: Any, path: str) -> Causes:
    """core ValidateNodeSelector: at least one term; operators and the ``metadata.name`` field rule."""
    terms = listed(mapping(value).get("nodeSelectorTerms"))
    if not terms:
        return [required(f"{path}.nodeSelectorTerms", "must have at least one node selector term")]
    causes: Causes = []
    for i, term in enumerate(terms):
        term_path = f"{path}.nodeSelectorTerms[{i}]"
        for j, req in enumerate(listed(mapping(term).get("matchExpressions"))):
            req_path = f"{term_path}.matchExpressions[{j}]"
            causes += label_key(mapping(req).get("key"), f"{req_path}.key")
            operator = mapping(req).get("operator")
            if operator not in ("DoesNotExist", "Exists", "Gt", "In", "Lt", "NotIn"):
                causes.append(unsupported(f"{req_path}.operator", operator,
                                          ("DoesNotExist", "Exists", "Gt", "In", "Lt", "NotIn")))
        for j, req in enumerate(listed(mapping(term).get("matchFields"))):
            req_path = f"{term_path}.matchFields[{j}]"
            if mapping(req).get("key") != "metadata.name":
                causes.append(invalid(f"{req_path}.key", mapping(req).get("key"), "not a valid field selector key"))
            if mapping(req).get("operator") not in ("In", "NotIn"):
                causes.append(invalid(f"{req_path}.operator", mapping(req).get("operator"),
                                      "not a valid selector operator"))
            elif len(listed(mapping(req).get("values"))) != 1:
                causes.append(required(f"{req_path}.values", "must be only one value when `operator` is 'In' or "
                                                             "'NotIn' for node field selector"))
    return causes


def pod_claim_references(spec: Mapping[str, Any]) -> Causes:
    """core validation's validateResourceClaimNames: each container's ``resources.claims`` entry names one of the
    pod's ``spec.resourceClaims``, once (by name and request)."""
    pod_claims = sorted({str(mapping(c).get("name")) for c in listed(spec.get("resourceClaims"))})
    causes: Causes = []
    for field in ("initContainers", "containers"):
        for i, container in enumerate(listed(spec.get(field))):
            seen: set[str] = set()
            for j, entry in enumerate(listed(mapping(mapping(container).get("resources")).get("claims"))):
                path, name = f"spec.{field}[{i}].resources.claims[{j}]", mapping(entry).get("name")
                if not name:
                    causes.append(required(path))
                    continue
                key = f"{name}/{mapping(entry)['request']}" if mapping(entry).get("request") else str(name)
                if key in seen:
                    causes.append(duplicate(path, key))
                seen.add(key)
                if name not in pod_claims:
                    listed_names = ": " + ", ".join(pod_claims) if pod_claims else " which is empty"
                    causes.append((path, f"Not found: {quoted(name)}: must be one of the names in "
                                         f"pod.spec.resourceClaims{listed_names}"))
    return causes


def opaque_config(item: Any, path: str) -> Causes:
    """validateDeviceConfiguration: ``opaque`` with a driver and ``parameters`` that are a JSON object."""
    opaque = mapping(item).get("opaque")
    if not isinstance(opaque, Mapping):
        return [required(f"{path}.opaque")]
    causes = driver_name(opaque.get("driver"), f"{path}.opaque.driver")
    if opaque.get("parameters") is None:
        causes.append(required(f"{path}.opaque.parameters"))
    elif not isinstance(opaque.get("parameters"), Mapping):
        causes.append(invalid(f"{path}.opaque.parameters", "<value omitted>", "must be a valid JSON object"))
    return causes
