"""Just enough of Kubernetes' protobuf encoding for what kubectl's and Helm's typed clients send.

kubectl sends built-in kinds as ``application/vnd.kubernetes.protobuf`` from its typed clients
(``kubectl create namespace``, ``create configmap``), Helm 4 keeps its releases in Secrets through one
(create, update, list, and on uninstall deletes with a protobuf ``DeleteOptions`` body); neither falls back
to JSON on a 415. Decoding every built-in type would need their schemas; metadata-and-maps kinds need
only the protobuf wire format and the field numbers of ObjectMeta, and ``DeleteOptions`` its own six
fields, so those are decoded here; a few kinds with their own structure (PodDisruptionBudget,
PriorityClass, Eviction) in :mod:`protostructs`. Anything else is answered 415 with a hint to use
``kubectl apply -f`` (which sends JSON).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

MAGIC = b"k8s\x00"

Field = tuple[int, int, Any]  # (number, wire type, value: int or bytes)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def fields(data: bytes) -> Iterator[Field]:
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, wire, value
        elif wire == 2:
            size, pos = _varint(data, pos)
            yield number, wire, data[pos : pos + size]
            pos += size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            yield number, wire, data[pos : pos + width]
            pos += width
        else:
            raise ValueError(f"unsupported wire type {wire}")


def _text(value: Any) -> str:
    return bytes(value).decode()


def _entry(value: bytes) -> tuple[str, bytes]:
    parts = {n: v for n, _, v in fields(value)}
    return _text(parts.get(1, b"")), bytes(parts.get(2, b""))


def object_meta(data: bytes) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    names = {1: "name", 2: "generateName", 3: "namespace"}
    for number, _, value in fields(data):
        if number in names:
            meta[names[number]] = _text(value)
        elif number in (11, 12):
            key, raw = _entry(value)
            meta.setdefault("labels" if number == 11 else "annotations", {})[key] = raw.decode()
        elif number == 14:
            meta.setdefault("finalizers", []).append(_text(value))
    return meta


def _string_maps(data: bytes, maps: dict[int, tuple[str, bool]]) -> dict[str, Any]:
    """Top-level fields: 1 = metadata, others = map fields named in ``maps`` (name, binary?)."""
    obj: dict[str, Any] = {}
    for number, _, value in fields(data):
        if number == 1:
            obj["metadata"] = object_meta(value)
        elif number in maps:
            name, binary = maps[number]
            key, raw = _entry(value)
            obj.setdefault(name, {})[key] = base64.b64encode(raw).decode() if binary else raw.decode()
    return obj


# kind -> its map fields; these kinds carry nothing but metadata and string maps
DECODABLE: dict[str, dict[int, tuple[str, bool]]] = {
    "Namespace": {},
    "ConfigMap": {2: ("data", False), 3: ("binaryData", True)},
    "Secret": {2: ("data", True), 4: ("stringData", False)},
    "ServiceAccount": {},
}


def _preconditions(data: bytes) -> dict[str, Any]:
    names = {1: "uid", 2: "resourceVersion"}
    return {names[n]: _text(v) for n, _, v in fields(data) if n in names}


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value  # int64 as a varint is two's complement


def delete_options(data: bytes) -> dict[str, Any]:
    """meta/v1 DeleteOptions (generated.proto field numbers): what a delete sends as its body."""
    options: dict[str, Any] = {}
    for number, _, value in fields(data):
        if number == 1:
            options["gracePeriodSeconds"] = _signed(value)
        elif number == 2:
            options["preconditions"] = _preconditions(bytes(value))
        elif number == 3:
            options["orphanDependents"] = bool(value)
        elif number == 4:
            options["propagationPolicy"] = _text(value)
        elif number == 5:
            options.setdefault("dryRun", []).append(_text(value))
        elif number == 6:
            options["ignoreStoreReadErrorWithClusterBreakingPotential"] = bool(value)
    return options


def decode(body: bytes) -> dict[str, Any]:
    """The JSON form of a protobuf-encoded object, or ValueError when it cannot be decoded here."""
    if not body.startswith(MAGIC):
        raise ValueError("not a Kubernetes protobuf envelope")
    unknown = {n: v for n, _, v in fields(body[len(MAGIC) :])}
    type_meta = {n: _text(v) for n, _, v in fields(bytes(unknown.get(1, b"")))}
    api_version, kind = type_meta.get(1, ""), type_meta.get(2, "")
    if kind == "DeleteOptions":  # Helm's and client-go's typed deletes (helm uninstall: its release Secrets)
        return {"apiVersion": api_version, "kind": kind, **delete_options(bytes(unknown.get(2, b"")))}
    from deviceshare.sandbox import protostructs  # (it reads fields with this module's helpers)

    structured = protostructs.DECODERS.get(kind)
    if structured is not None:
        return {"apiVersion": api_version, "kind": kind, **structured(bytes(unknown.get(2, b"")))}
    if kind not in DECODABLE:
        known = sorted({*DECODABLE, *protostructs.DECODERS})
        raise ValueError(f"the sandbox decodes protobuf only for {', '.join(known)}, not {kind!r}")
    obj = _string_maps(bytes(unknown.get(2, b"")), DECODABLE[kind])
    if kind == "Secret":
        for number, wire, value in fields(bytes(unknown.get(2, b""))):
            if number == 3 and wire == 2:
                obj["type"] = _text(value)
    return {"apiVersion": api_version, "kind": kind, **obj}
