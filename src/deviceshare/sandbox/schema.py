"""Structural-schema handling of custom objects: defaults, pruning, validation, CEL rules.

It follows the order of kube-apiserver: unknown fields are pruned, defaults applied, then the
OpenAPI v3 constraints (type, required, enum, minimum/maximum, min/maxLength, pattern,
min/maxItems, min/maxProperties) and the ``x-kubernetes-validations`` CEL rules are checked.
Messages use the real API's wording, e.g. ``spec.resources: Required value``.

CEL: every rule is evaluated with ``self`` (and ``oldSelf`` on updates; rules that mention
``oldSelf`` are skipped on create, as transition rules are). Not evaluated: ``messageExpression``
(the static ``message`` is used), ``reason``/``fieldPath`` overrides, ratcheting, cost limits,
and the Kubernetes CEL library extensions that cel-python lacks (``isSorted``, ``quantity``, ``url``...).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from typing import Any

from deviceshare.sandbox import cel

Cause = tuple[str, str]
_ABSENT = object()


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _shown(value: Any) -> str:
    if isinstance(value, Mapping):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    return json.dumps(value)


def prune_and_default(schema: Mapping[str, Any], value: Any, *, root: bool = True) -> Any:
    """A copy of ``value`` without fields the schema does not know, with defaults filled in."""
    if isinstance(value, dict) and schema.get("type", "object") == "object":
        props: Mapping[str, Any] = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields") or (
            props == {} and additional is None
        )
        result: dict[str, Any] = {}
        for key, item in value.items():
            if root and key in ("apiVersion", "kind", "metadata"):
                result[key] = item
            elif key in props:
                result[key] = prune_and_default(props[key], item, root=False)
            elif isinstance(additional, Mapping):
                result[key] = prune_and_default(additional, item, root=False)
            elif keep_unknown or additional is True:
                result[key] = item
        for key, sub in props.items():
            if key not in result and "default" in sub:
                result[key] = prune_and_default(sub, copy.deepcopy(sub["default"]), root=False)
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [prune_and_default(schema["items"], item, root=False) for item in value]
    return value


def _type_ok(kind: str | None, value: Any) -> bool:
    if kind is None:
        return True
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "integer,string":
        return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return True


def validate(schema: Mapping[str, Any], value: Any, old: Any = _ABSENT, path: str = "") -> list[Cause]:
    """Every violation as (field path, message); an empty list means the value is valid."""
    causes: list[Cause] = []
    if value is None and schema.get("nullable"):
        return causes
    kind = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):  # quantities: an integer or a string, nothing else
        kind = "integer,string"
    if not _type_ok(kind, value):
        causes.append(
            (
                path,
                f"Invalid value: {_shown(value)}: {path or 'body'} in body must be of type {kind}: "
                f"{_shown(value)}",
            )
        )
        return causes
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(json.dumps(v) for v in schema["enum"])
        causes.append((path, f"Unsupported value: {json.dumps(value)}: supported values: {allowed}"))
    causes += _bounds(schema, value, path)
    if isinstance(value, dict):
        causes += _object(schema, value, old, path)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            causes += validate(schema["items"], item, _ABSENT, f"{path}[{index}]")
    if not causes:
        causes += _rules(schema, value, old, path)
    return causes


def _bounds(schema: Mapping[str, Any], value: Any, path: str) -> list[Cause]:
    causes: list[Cause] = []
    where = path or "body"
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            causes.append(
                (
                    path,
                    f"Invalid value: {value}: {where} in body should be greater than or equal "
                    f"to {schema['minimum']}",
                )
            )
        if "maximum" in schema and value > schema["maximum"]:
            causes.append(
                (
                    path,
                    f"Invalid value: {value}: {where} in body should be less than or equal "
                    f"to {schema['maximum']}",
                )
            )
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            causes.append((path, f"Too long: may not be more than {schema['maxLength']} bytes"))
        if "minLength" in schema and len(value) < schema["minLength"]:
            causes.append(
                (
                    path,
                    f"Invalid value: {json.dumps(value)}: {where} in body should be at least "
                    f"{schema['minLength']} chars long",
                )
            )
        if "pattern" in schema and not re.search(schema["pattern"], value):
            causes.append(
                (
                    path,
                    f"Invalid value: {json.dumps(value)}: {where} in body should match '{schema['pattern']}'",
                )
            )
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            causes.append((path, f"Too many: {len(value)}: must have at most {schema['maxItems']} items"))
        if "minItems" in schema and len(value) < schema["minItems"]:
            causes.append(
                (
                    path,
                    f"Invalid value: {len(value)}: {where} in body should have at least "
                    f"{schema['minItems']} items",
                )
            )
    if isinstance(value, dict):
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            causes.append(
                (path, f"Too many: {len(value)}: must have at most {schema['maxProperties']} items")
            )
        if "minProperties" in schema and len(value) < schema["minProperties"]:
            causes.append(
                (
                    path,
                    f"Invalid value: {len(value)}: {where} in body should have at least "
                    f"{schema['minProperties']} properties",
                )
            )
    return causes


def _object(schema: Mapping[str, Any], value: dict[str, Any], old: Any, path: str) -> list[Cause]:
    causes: list[Cause] = []
    props: Mapping[str, Any] = schema.get("properties") or {}
    for key in schema.get("required") or []:
        if key not in value:
            causes.append((_join(path, key), "Required value"))
    additional = schema.get("additionalProperties")
    old_map = old if isinstance(old, dict) else {}
    for key, item in value.items():
        if not path and key == "metadata":
            continue
        sub = props.get(key, additional if isinstance(additional, Mapping) else None)
        if sub is not None:
            causes += validate(sub, item, old_map.get(key, _ABSENT), _join(path, key))
    return causes


def _rules(schema: Mapping[str, Any], value: Any, old: Any, path: str) -> list[Cause]:
    causes: list[Cause] = []
    for rule in schema.get("x-kubernetes-validations") or []:
        expression = rule["rule"]
        variables: dict[str, Any] = {"self": value}
        if cel.is_transition_rule(expression):
            if old is _ABSENT:
                continue
            variables["oldSelf"] = old
        try:
            ok = cel.is_true(expression, variables)
        except cel.CelError as e:
            causes.append((path, f"Invalid value: {_shown(value)}: rule evaluation error: {e}"))
            continue
        if not ok:
            message = rule.get("message") or f"failed rule: {expression}"
            causes.append((path, f"Invalid value: {_shown(value)}: {message}"))
    return causes


def check(schema: Mapping[str, Any], obj: Any, old: Any | None) -> list[Cause]:
    return validate(schema, obj, _ABSENT if old is None else old, "")


def unknown_fields(schema: Mapping[str, Any], value: Any, path: str = "") -> list[str]:
    """Paths the schema does not declare (what ``fieldValidation=Strict`` rejects instead of pruning)."""
    found: list[str] = []
    if isinstance(value, Mapping) and schema.get("type", "object") == "object":
        props: Mapping[str, Any] = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        open_ended = schema.get("x-kubernetes-preserve-unknown-fields") or (
            props == {} and additional is None
        )
        for key, item in value.items():
            if not path and key in ("apiVersion", "kind", "metadata"):
                continue
            if key in props:
                found += unknown_fields(props[key], item, _join(path, key))
            elif isinstance(additional, Mapping):
                found += unknown_fields(additional, item, _join(path, key))
            elif not (open_ended or additional is True):
                found.append(_join(path, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            found += unknown_fields(schema["items"], item, f"{path}[{index}]")
    return found
