"""Reading a request as kube-apiserver reads it: the path, the body, and the query's flags.

Apart from the routing in ``apiserver`` because none of it decides anything: it turns the URL into a
:class:`Target`, the body (JSON, YAML, or kubectl's protobuf) into a dict, and ``dryRun``, the
boolean flags, selectors, ``fieldValidation=Strict`` and Table negotiation into values, with the
real server's errors (400, 415) for what it cannot read.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

import kmock
import yaml

from deviceshare.sandbox import catalog, errors, protobuf, schema, selectors


@dataclasses.dataclass(frozen=True)
class Target:
    group: str
    version: str
    plural: str | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


def parse_path(path: str) -> Target | None:
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    if (
        len(rest) >= 3
        and rest[0] == "namespaces"
        and not (len(rest) == 3 and rest[2] in ("status", "finalize"))
    ):
        namespace, rest = rest[1], rest[2:]
    if len(rest) > 3:
        return None
    padded = [*rest, None, None, None]
    return Target(group, version, padded[0], namespace, padded[1], padded[2])


def dry_run(params: Mapping[str, str], delete_options: Any) -> bool:
    """``dryRun=All`` from the query, or for a delete from its DeleteOptions body (where kubectl puts it)."""
    value = params.get("dryRun")
    if value is None and isinstance(delete_options, Mapping) and delete_options.get("dryRun"):
        value = ",".join(delete_options["dryRun"])
    if value is None:
        return False
    if value != "All":
        raise errors.bad_request(f'dryRun: Unsupported value: "{value}": supported values: "All"')
    return True


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def write_deadline(method: str, params: Mapping[str, str]) -> float | None:
    """A write's ``timeout`` query parameter in seconds (Go's ``time.ParseDuration``, e.g. ``1500ms``, ``2m3s``):
    kube-apiserver gives up on a create/update/patch/delete that has not finished by then. None: not a write, or
    no (or an unreadable) timeout — the server's own default then applies, which the sandbox does not model."""
    raw = params.get("timeout")
    if method.upper() == "GET" or not raw:
        return None
    parts = _DURATION.findall(raw)
    if not parts or "".join(n + u for n, u in parts) != raw:
        return None
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)


def flag(params: Mapping[str, str], name: str) -> bool:
    return params.get(name, "").lower() in ("true", "1")


def wants_table(request: kmock.Request) -> bool:
    """``kubectl get`` asks for server-side Table output in its Accept header."""
    return "as=Table" in request.headers.get("Accept", "")


def selectors_of(
    params: Mapping[str, str], rtype: catalog.ResourceType
) -> tuple[selectors.LabelSelector, selectors.FieldSelector]:
    """The ``labelSelector`` and ``fieldSelector`` of a list or watch (fields the kind can select on)."""
    labels = selectors.parse_labels(params.get("labelSelector"))
    return labels, selectors.parse_fields(params.get("fieldSelector"), rtype.selectable)


def check_custom_body(request: kmock.Request, rtype: catalog.ResourceType) -> None:
    """Custom resources have no protobuf form: kube-apiserver refuses such a body with this 415 (and so
    clients that can, such as Helm's and kubectl's dynamic clients, send JSON for them)."""
    if rtype.custom and request.body and "protobuf" in request.headers.get("Content-Type", ""):
        raise errors.ApiError(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: "
            "application/json, application/yaml",
        )


def decode(request: kmock.Request) -> Any:
    if not request.body:
        return None
    content_type = request.headers.get("Content-Type", "")
    if "protobuf" in content_type:
        try:
            return protobuf.decode(request.body)
        except ValueError as e:
            raise errors.ApiError(
                415,
                "UnsupportedMediaType",
                f"{e}; send JSON instead (e.g. kubectl apply -f, or "
                "kubectl create ... --dry-run=client -o yaml | kubectl apply -f -)",
            ) from e
    if "cbor" in content_type:
        raise errors.ApiError(
            415,
            "UnsupportedMediaType",
            f"the body of the request was in an unknown format "
            f"- accepted media types include: application/json, application/yaml "
            f"(got {content_type})",
        )
    try:
        if "yaml" in content_type:
            return yaml.safe_load(request.body)
        return json.loads(request.body, parse_constant=_not_json)
    except (ValueError, yaml.YAMLError) as e:
        raise errors.bad_request(f"the body of the request could not be decoded: {e}") from e


def _not_json(name: str) -> Any:
    """NaN and Infinity are no JSON values (Python's decoder takes them, Go's refuses them)."""
    raise ValueError(f"invalid character {name[0]!r} looking for beginning of value")


def check_strict(request: kmock.Request, rtype: catalog.ResourceType, body: Any) -> None:
    """``fieldValidation=Strict`` (kubectl's default): unknown fields are a 400, not pruned."""
    if request.params.get("fieldValidation") != "Strict" or rtype.schema is None:
        return
    unknown = schema.unknown_fields(rtype.schema, body)
    if unknown:
        fields = ", ".join(f'unknown field "{u}"' for u in unknown)
        raise errors.bad_request(
            f'{rtype.kind} in version "{rtype.version}" cannot be handled as a {rtype.kind}: '
            f"strict decoding error: {fields}"
        )
