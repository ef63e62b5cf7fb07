"""The string, list and regex functions of Kubernetes' CEL base environment that cel-python lacks, for device
selectors (see ``dracel`` for the device value, equality, quantity and semver).

Read from: cel-go ext/strings.go (positions count Unicode code points; ``lowerAscii``/``upperAscii`` change
ASCII letters only; ``split``/``replace`` take Go's ``SplitN``/``Replace`` count, negative for all; ``trim`` is
``strings.TrimSpace``), k8s.io/apiserver/pkg/cel/library/lists.go (``isSorted``, ``sum``, ``min``, ``max``,
``indexOf``, ``lastIndexOf`` on lists) and regex.go (``find``, ``findAll`` with RE2, as ``matches``), and
k8s.io/dynamic-resource-allocation/cel/compile.go's ``includes`` (a list attribute contains the value, or a
scalar equals it).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import re2  # type: ignore[import-untyped]  # cel-python's dependency, RE2 as cel-go's matches()
from celpy import celtypes

from deviceshare.core.dracel import Value, as_int, as_string, error, guarded, is_number, same, type_name

_SPACE = " \t\n\v\f\r\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029" \
         "\u202f\u205f\u3000"
_MAX_INCLUDES = 64  # ResourceSliceMaxAttributeValuesPerDevice's guard in includesFunc


def _list(v: Value) -> list[Any]:
    if not isinstance(v, celtypes.ListType):
        raise TypeError
    return list(v)


def _char_at(s: Value, i: Value) -> Value:
    text, index = as_string(s), as_int(i)
    if not 0 <= index <= len(text):
        raise ValueError(f"index out of range: {index}")
    return celtypes.StringType(text[index:index + 1])


def _index_of(target: Value, item: Value, offset: Value = None) -> Value:
    if isinstance(target, celtypes.ListType):
        if offset is not None:
            raise TypeError
        return celtypes.IntType(next((i for i, v in enumerate(target) if same(v, item)), -1))
    text, sub = as_string(target), as_string(item)
    start = 0 if offset is None else as_int(offset)
    if not 0 <= start <= len(text):
        raise ValueError(f"index out of range: {start}")
    return celtypes.IntType(text.find(sub, start))


def _last_index_of(target: Value, item: Value, offset: Value = None) -> Value:
    if isinstance(target, celtypes.ListType):
        if offset is not None:
            raise TypeError
        found = [i for i, v in enumerate(target) if same(v, item)]
        return celtypes.IntType(found[-1] if found else -1)
    text, sub = as_string(target), as_string(item)
    end = len(text) if offset is None else as_int(offset)
    if not 0 <= end <= len(text):
        raise ValueError(f"index out of range: {end}")
    return celtypes.IntType(text.rfind(sub, 0, end + len(sub)))


def _ascii(s: Value, upper: bool) -> Value:
    text = as_string(s)
    table = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ") if upper else \
        str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
    return celtypes.StringType(text.translate(table))


def _replace(s: Value, old: Value, new: Value, n: Value = None) -> Value:
    count = -1 if n is None else as_int(n)
    return celtypes.StringType(as_string(s).replace(as_string(old), as_string(new), count if count >= 0 else -1))


def _split(s: Value, sep: Value, n: Value = None) -> Value:
    text, separator, limit = as_string(s), as_string(sep), -1 if n is None else as_int(n)
    if limit == 0:
        return celtypes.ListType([])
    if separator == "":  # Go splits into code points
        parts = list(text) if limit < 0 or limit >= len(text) else [*text[:limit - 1], text[limit - 1:]]
    else:
        parts = text.split(separator, limit - 1 if limit > 0 else -1)
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


def _substring(s: Value, start: Value, end: Value = None) -> Value:
    text, begin = as_string(s), as_int(start)
    stop = len(text) if end is None else as_int(end)
    if not 0 <= begin <= len(text) or not 0 <= stop <= len(text):
        raise ValueError(f"index out of range: {begin if not 0 <= begin <= len(text) else stop}")
    if begin > stop:
        raise ValueError(f"invalid substring range. start: {begin}, end: {stop}")
    return celtypes.StringType(text[begin:stop])


def _join(items: Value, sep: Value = None) -> Value:
    separator = "" if sep is None else as_string(sep)
    return celtypes.StringType(separator.join(as_string(v) for v in _list(items)))


def _reverse(s: Value) -> Value:
    return celtypes.StringType(as_string(s)[::-1])


def _trim(s: Value) -> Value:
    return celtypes.StringType(as_string(s).strip(_SPACE))


def _comparable_items(items: list[Any]) -> list[Any]:
    kinds = {"number" if is_number(v) else type_name(v) for v in items}
    if len(kinds) > 1 or kinds - {"number", "string", "bool", "bytes", "timestamp", "duration"}:
        raise TypeError
    return items


def _is_sorted(items: Value) -> Value:
    values = _comparable_items(_list(items))
    return celtypes.BoolType(all(a <= b for a, b in itertools.pairwise(values)))


def _sum(items: Value) -> Value:
    values = _list(items)
    if not values:
        return celtypes.IntType(0)
    kinds = {type_name(v) for v in values}
    if len(kinds) != 1 or not kinds <= {"int", "uint", "double", "duration"}:
        raise TypeError
    total = values[0]
    for v in values[1:]:
        total = total + v  # celpy's own types check overflow
    return total


def _extreme(name: str, pick: Callable[[list[Any]], Any]) -> Callable[[Value], Value]:
    def choose(items: Value) -> Value:
        values = _comparable_items(_list(items))
        if not values:
            raise ValueError(f"{name} called on empty list")
        return pick(values)
    return choose


def _find(s: Value, pattern: Value) -> Value:
    match = _regex(pattern).search(as_string(s))
    return celtypes.StringType(match.group(0) if match else "")


def _find_all(s: Value, pattern: Value, n: Value = None) -> Value:
    limit = -1 if n is None else as_int(n)
    found = [m.group(0) for m in _regex(pattern).finditer(as_string(s))]
    if limit >= 0:
        found = found[:limit]
    return celtypes.ListType([celtypes.StringType(f) for f in found])


def _regex(pattern: Value) -> Any:
    try:
        return re2.compile(as_string(pattern))
    except re2.error as e:
        raise ValueError(f"invalid regex {str(pattern)!r}: {e}") from None


def _includes(target: Value, item: Value) -> Value:
    if isinstance(target, celtypes.ListType):
        if len(target) > _MAX_INCLUDES:
            return error(f"'includes' function cannot be applied to lists longer than {_MAX_INCLUDES} values")
        return celtypes.BoolType(any(same(v, item) for v in target))
    return celtypes.BoolType(same(target, item))


_LIBRARY: dict[str, Callable[..., Value]] = {
    "charAt": _char_at,
    "indexOf": _index_of,
    "lastIndexOf": _last_index_of,
    "lowerAscii": lambda s: _ascii(s, upper=False),
    "upperAscii": lambda s: _ascii(s, upper=True),
    "replace": _replace,
    "split": _split,
    "substring": _substring,
    "join": _join,
    "reverse": _reverse,
    "trim": _trim,
    "isSorted": _is_sorted,
    "sum": _sum,
    "min": _extreme("min", min),
    "max": _extreme("max", max),
    "find": _find,
    "findAll": _find_all,
    "includes": _includes,
}

STRINGS_LISTS_REGEX = {name: guarded(name, func) for name, func in _LIBRARY.items()}
