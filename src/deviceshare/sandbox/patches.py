"""The three PATCH dialects of kube-apiserver, applied to plain dicts.

JSON merge patch (RFC 7386) and JSON patch (RFC 6902, via ``jsonpatch``) are exact. Strategic
merge patch covers what kubectl and Kopf send on built-in kinds: lists of containers, env, volumes,
conditions, ... merge by their key; ``finalizers`` merge as a set; the ``$patch``,
``$setElementOrder``, ``$retainKeys`` and ``$deleteFromPrimitiveList`` directives are understood.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import jsonpatch

from deviceshare.sandbox import errors

MERGE = "application/merge-patch+json"
JSON = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"

# list field -> key its items merge by (the patchMergeKey of the Kubernetes types)
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "conditions": "type",
    "ownerReferences": "uid",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name",
    "taints": "key",
    "addresses": "type",
}
PRIMITIVE_MERGE = frozenset({"finalizers"})


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: Any, operations: Any) -> Any:
    if not isinstance(operations, list):
        raise errors.bad_request("json patch must be a list of operations")
    try:
        return jsonpatch.JsonPatch(operations).apply(copy.deepcopy(target))
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
        raise errors.ApiError(
            422, "Invalid", f"the server rejected our request due to an error in our request: {e}"
        ) from e


def _merge_key(field: str, items: list[Any]) -> str | None:
    if field == "ports":
        sample = next((i for i in items if isinstance(i, Mapping)), {})
        return "containerPort" if "containerPort" in sample else "port"
    return MERGE_KEYS.get(field)


def _merge_list(field: str, current: list[Any], patch: list[Any]) -> list[Any]:
    if field in PRIMITIVE_MERGE:
        return list(current) + [v for v in patch if v not in current]
    key = _merge_key(field, patch + current)
    if key is None or not all(isinstance(i, Mapping) for i in patch):
        return [v for v in patch if not (isinstance(v, Mapping) and "$patch" in v)]
    if any(isinstance(i, Mapping) and i.get("$patch") == "replace" for i in patch):
        return [strip_directives(i) for i in patch if i.get("$patch") != "replace"]
    result = [copy.deepcopy(i) for i in current]
    for item in patch:
        index = next(
            (n for n, c in enumerate(result) if isinstance(c, Mapping) and c.get(key) == item.get(key)), None
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append(strategic_merge(None, item))
        else:
            result[index] = strategic_merge(result[index], item)
    return result


def strip_directives(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: strip_directives(v) for k, v in value.items() if not str(k).startswith("$")}
    if isinstance(value, list):
        return [strip_directives(v) for v in value]
    return value


def strategic_merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return strip_directives({k: v for k, v in patch.items() if k != "$patch"})
    if directive == "delete":
        return None
    result: dict[str, Any] = dict(target) if isinstance(target, Mapping) else {}
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [v for v in result.get(field) or [] if v not in value]
        elif key.startswith("$"):
            continue
        elif value is None:
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(key, result[key], value)
        elif isinstance(value, list):
            result[key] = [
                strip_directives(v) for v in value if not (isinstance(v, Mapping) and "$patch" in v)
            ]
        else:
            merged = strategic_merge(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain or k in patch}
    return result


def apply(content_type: str, target: Mapping[str, Any], patch: Any, *, custom: bool) -> Any:
    """Apply a patch of the given media type; custom resources refuse strategic merge (415)."""
    media = content_type.split(";")[0].strip().lower()
    if media == MERGE or media == "application/json":
        return merge_patch(target, patch)
    if media == JSON:
        return json_patch(target, patch)
    if media == STRATEGIC and not custom:
        return strategic_merge(target, patch)
    raise errors.unsupported_media_type(media)
