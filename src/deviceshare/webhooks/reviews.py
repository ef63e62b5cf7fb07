"""The shape of an AdmissionReview, checked before any decision reads it.

The API server builds every review from typed objects, so its fields always have the JSON types of
the Kubernetes API. A body whose fields do not comes from some other client (the webhook's port is
open to every pod unless a NetworkPolicy closes it), from a proxy that damaged it, or from a bug;
whichever, no decision may crash on it. This module checks the review's envelope and every field the
decisions read, and names the first wrong one by its JSON path
(``request.object.spec.containers[0].env is a string, not an array``). Two errors, because the server
answers them differently (:mod:`server`, docs/security.md):

- :class:`NotAReview`: there is no review to answer: not JSON, not an object, no ``request.uid``;
- :class:`MalformedReview`: a review with a uid whose content is malformed.

Pure: no I/O. Path strings are built only when a check fails; a well-formed review costs a walk
over the few fields the decisions read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, NoReturn

from deviceshare.api import names

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")

Path = tuple[str | int, ...]
_REQUEST: Path = ("request",)
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class MalformedReview(ValueError):
    """A review whose content the webhook cannot read; the message names the field."""


class NotAReview(MalformedReview):
    """A body that is no AdmissionReview at all: nothing to answer as a review."""


def parse(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object (raises :class:`NotAReview` naming what is wrong)."""
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except NotAReview:
        raise
    except json.JSONDecodeError as e:
        raise NotAReview(f"the body is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    except UnicodeDecodeError:
        raise NotAReview("the body is not UTF-8 JSON") from None
    except RecursionError:  # nesting deeper than the parser's stack: no AdmissionReview is like that
        raise NotAReview("the body's JSON is nested too deeply") from None
    except ValueError:  # an integer longer than Python reads (4,300 digits): no API field holds one
        raise NotAReview("the body has a number too long to read") from None
    if not isinstance(body, dict):
        raise NotAReview(f"the body is {describe(body)}, not an object")
    return body


def _no_constant(name: str) -> NoReturn:
    raise NotAReview(f"the body is not valid JSON: {name} is not a JSON value")


def envelope(body: Any) -> tuple[str, Mapping[str, Any]]:
    """The review's ``apiVersion`` and its request, which has a uid (raises :class:`NotAReview`)."""
    if not isinstance(body, Mapping):
        raise NotAReview(f"the body is {describe(body)}, not an object")
    if body.get("kind") != "AdmissionReview":
        raise NotAReview("the body's kind is not AdmissionReview")
    api_version = body.get("apiVersion", API_VERSIONS[0])
    if api_version not in API_VERSIONS:
        raise NotAReview(f"apiVersion is not {' or '.join(API_VERSIONS)}")
    request = body.get("request")
    if request is None:
        raise NotAReview("request is missing")
    if not isinstance(request, Mapping):
        _fail(_REQUEST, request, "an object", NotAReview)
    uid = request.get("uid")
    if uid is None:
        raise NotAReview("request.uid is missing")
    if not isinstance(uid, str):
        _fail(("request", "uid"), uid, "a string", NotAReview)
    if not uid:
        raise NotAReview("request.uid is empty")
    return str(api_version), request


def request_of(body: Any) -> Mapping[str, Any]:
    """The request of a review whose envelope fields all have their API types (raises
    :class:`NotAReview` or :class:`MalformedReview`). ``kind`` and ``operation`` are required."""
    _, request = envelope(body)
    kind = _object(request, "kind", _REQUEST, required=True)
    for key in ("group", "version", "kind"):
        _string(kind, key, (*_REQUEST, "kind"))
    for key in ("resource", "requestKind", "requestResource"):
        part = _object(request, key, _REQUEST)
        for field in ("group", "version", "resource", "kind"):
            _string(part, field, (*_REQUEST, key))
    _string(request, "operation", _REQUEST, required=True)
    for key in ("name", "namespace", "subResource", "requestSubResource"):
        _string(request, key, _REQUEST)
    for key in ("object", "oldObject", "options", "userInfo"):
        _object(request, key, _REQUEST)
    dry_run = request.get("dryRun")
    if dry_run is not None and not isinstance(dry_run, bool):
        _fail((*_REQUEST, "dryRun"), dry_run, "a boolean")
    return request


def is_group_write(request: Mapping[str, Any], operations: tuple[str, ...]) -> bool:
    """Whether the request writes a SharedDeviceGroup itself (not a subresource) by one of ``operations``."""
    kind = request["kind"]
    return (
        request["operation"] in operations
        and kind.get("group") == names.GROUP
        and kind.get("kind") == names.KIND
        and not request.get("subResource")
    )


def check_pod(pod: Mapping[str, Any], at: Path = ("request", "object")) -> None:
    """Every field of a pod that the admission decision reads has its API type (raises :class:`MalformedReview`)."""
    meta = _object(pod, "metadata", at)
    meta_at = (*at, "metadata")
    for key in ("name", "namespace", "generateName"):
        _string(meta, key, meta_at)
    _string_map(meta, "annotations", meta_at)
    _string_map(meta, "labels", meta_at)
    spec = _object(pod, "spec", at)
    spec_at = (*at, "spec")
    _string(spec, "nodeName", spec_at)
    _string(spec, "schedulerName", spec_at)
    for i, toleration in _objects(spec, "tolerations", spec_at):
        for key in ("key", "operator", "effect"):
            _string(toleration, key, (*spec_at, "tolerations", i))
    for i, claim in _objects(spec, "resourceClaims", spec_at):
        for key in ("name", "resourceClaimName", "resourceClaimTemplateName"):
            _string(claim, key, (*spec_at, "resourceClaims", i))
    for list_name in ("initContainers", "containers"):
        for i, container in _objects(spec, list_name, spec_at):
            _check_container(container, (*spec_at, list_name, i))


def _check_container(container: Mapping[str, Any], at: Path) -> None:
    _string(container, "name", at)
    for j, entry in _objects(container, "env", at):
        entry_at = (*at, "env", j)
        _string(entry, "name", entry_at, required=True)
        _string(entry, "value", entry_at)
        value_from = _object(entry, "valueFrom", entry_at)
        field_ref = _object(value_from, "fieldRef", (*entry_at, "valueFrom"))
        for key in ("fieldPath", "apiVersion"):
            _string(field_ref, key, (*entry_at, "valueFrom", "fieldRef"))
    resources = _object(container, "resources", at)
    for j, claim in _objects(resources, "claims", (*at, "resources")):
        for key in ("name", "request"):
            _string(claim, key, (*at, "resources", "claims", j))
    for section in ("limits", "requests"):
        listed = _object(resources, section, (*at, "resources"))
        for name, quantity in listed.items():
            if isinstance(quantity, bool) or not isinstance(quantity, str | int | float):
                _fail((*at, "resources", section, name), quantity, "a quantity")


def check_group(group: Mapping[str, Any], at: Path) -> None:
    """Every field of a SharedDeviceGroup that the budget decision reads has its API type."""
    meta = _object(group, "metadata", at)
    for key in ("name", "namespace"):
        _string(meta, key, (*at, "metadata"))
    spec = _object(group, "spec", at)
    resources = _object(spec, "resources", (*at, "spec"))
    for name, count in resources.items():
        if type(count) is not int:
            _fail((*at, "spec", "resources", name), count, "a whole number")
    claim = _object(spec, "claim", (*at, "spec"))
    if claim:
        _string(claim, "deviceClassName", (*at, "spec", "claim"), required=True)
        if type(claim.get("count", 1)) is not int:
            _fail((*at, "spec", "claim", "count"), claim.get("count"), "a whole number")


# -- the checks: each returns the value to read on, or raises naming the path -------------------------------


def _object(parent: Mapping[str, Any], key: str, at: Path, *, required: bool = False) -> Mapping[str, Any]:
    """``parent[key]`` as an object; absent or null reads as empty unless ``required``."""
    value = parent.get(key)
    if type(value) is dict or isinstance(value, Mapping):
        return value
    if value is None:
        if required:
            raise MalformedReview(f"{format_path((*at, key))} is missing")
        return {}
    _fail((*at, key), value, "an object")


def _objects(parent: Mapping[str, Any], key: str, at: Path) -> list[tuple[int, Mapping[str, Any]]]:
    """``parent[key]`` as an array of objects, each with its index."""
    value = parent.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        _fail((*at, key), value, "an array")
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            _fail((*at, key, i), item, "an object")
    return list(enumerate(value))


def _string(parent: Mapping[str, Any], key: str, at: Path, *, required: bool = False) -> None:
    value = parent.get(key)
    if isinstance(value, str):
        return
    if key not in parent:
        if required:
            raise MalformedReview(f"{format_path((*at, key))} is missing")
        return
    _fail((*at, key), value, "a string")  # null too: the API never sends a null string


def _string_map(parent: Mapping[str, Any], key: str, at: Path) -> None:
    for name, value in _object(parent, key, at).items():
        if not isinstance(value, str):
            _fail((*at, key, name), value, "a string")


def _fail(at: Path, value: Any, wanted: str, error: type[MalformedReview] = MalformedReview) -> NoReturn:
    raise error(f"{format_path(at)} is {describe(value)}, not {wanted}")


def describe(value: Any) -> str:
    """A JSON value's type, as a user reads it: never the value itself, which may be huge."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def format_path(at: Path) -> str:
    """``request.object.metadata.annotations["deviceshare.io/device-group"]``, ``...containers[0].env``."""
    out = ""
    for part in at:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _IDENTIFIER.match(part):
            out += f".{part}" if out else part
        else:
            shown = part if len(part) <= 64 else part[:64] + "..."
            out += f"[{json.dumps(shown)}]"
    return out
