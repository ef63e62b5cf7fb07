"""Protobuf bodies of the disruption and priority kinds kubectl sends: PodDisruptionBudget, PriorityClass,
Eviction (``kubectl create poddisruptionbudget``, ``kubectl create priorityclass``, ``kubectl drain``).

Their typed clients encode them as protobuf; :mod:`protobuf` reads the envelope and metadata, this
module the fields of these kinds, by the field numbers of k8s.io/api's generated.proto
(policy/v1, scheduling/v1) and apimachinery's (IntOrString, LabelSelector, DeleteOptions).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deviceshare.sandbox import protobuf


def _text(value: Any) -> str:
    return bytes(value).decode()


def _signed(value: int, bits: int = 64) -> int:
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


def _int_or_string(data: bytes) -> int | str:
    parts = {n: v for n, _, v in protobuf.fields(data)}
    if parts.get(1, 0) == 1:  # type String
        return _text(parts.get(3, b""))
    return _signed(int(parts.get(2, 0)), 32)


def _selector(data: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for number, _, value in protobuf.fields(data):
        if number == 1:
            entry = {n: _text(v) for n, _, v in protobuf.fields(bytes(value))}
            out.setdefault("matchLabels", {})[entry.get(1, "")] = entry.get(2, "")
        elif number == 2:
            requirement: dict[str, Any] = {"key": "", "operator": ""}
            for n, _, v in protobuf.fields(bytes(value)):
                if n == 3:
                    requirement.setdefault("values", []).append(_text(v))
                else:
                    requirement[{1: "key", 2: "operator"}.get(n, str(n))] = _text(v)
            out.setdefault("matchExpressions", []).append(requirement)
    return out


def _budget(data: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {"spec": {}}
    for number, _, value in protobuf.fields(data):
        if number == 1:
            obj["metadata"] = protobuf.object_meta(bytes(value))
        elif number == 2:
            for n, _, v in protobuf.fields(bytes(value)):
                if n in (1, 3):
                    obj["spec"]["minAvailable" if n == 1 else "maxUnavailable"] = _int_or_string(bytes(v))
                elif n == 2:
                    obj["spec"]["selector"] = _selector(bytes(v))
                elif n == 4:
                    obj["spec"]["unhealthyPodEvictionPolicy"] = _text(v)
    return obj


def _priority_class(data: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for number, _, value in protobuf.fields(data):
        if number == 1:
            obj["metadata"] = protobuf.object_meta(bytes(value))
        elif number == 2:
            obj["value"] = _signed(int(value), 64)
        elif number == 3 and value:  # (omitempty on the JSON side, like the description)
            obj["globalDefault"] = True
        elif number in (4, 5) and value:
            obj["description" if number == 4 else "preemptionPolicy"] = _text(value)
    return obj


def _eviction(data: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for number, _, value in protobuf.fields(data):
        if number == 1:
            obj["metadata"] = protobuf.object_meta(bytes(value))
        elif number == 2:
            obj["deleteOptions"] = protobuf.delete_options(bytes(value))
    return obj


DECODERS: dict[str, Callable[[bytes], dict[str, Any]]] = {
    "PodDisruptionBudget": _budget,
    "PriorityClass": _priority_class,
    "Eviction": _eviction,
}
