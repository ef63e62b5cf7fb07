"""A list's body decoded one item at a time, so that one huge answer never sits in memory as objects all at once.

A server may answer a LIST whole, ignoring ``limit`` (kube-apiserver's watch cache served ``resourceVersion=0``
lists whole for years): 140,000 pods in one 230 MiB body. ``orjson.loads`` of that body makes every pod's dicts
before the first one can be made into a record, several times the body's size (1.4 GiB measured, issue 34).
:class:`ListBody` finds each item's extent in the bytes instead and decodes the items one by one, as they are
asked for; each can be made into what the caller keeps and dropped before the next is decoded. The list's own
fields (``metadata``: resourceVersion, continue) are decoded apart, with the items left out.

Finding an item's end without parsing it: in the compact JSON that kube-apiserver writes (and the sandbox),
consecutive items are joined by ``},{`` and the last ends in ``}]``. Such a place where as many ``{`` as ``}``
lie between the item's start and it is almost always the item's end; ``orjson`` decoding exactly that slice is the
proof (a slice that ends early is unfinished JSON, one that ends late has trailing characters: either fails).
Braces inside strings can make the count lie; an item where it does is scanned again string by string (a regular
expression that skips whole strings), slower and exact. A body of another shape (``items`` not found where a
list has it, whitespace between items) is decoded whole, as before.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import orjson

# Past this many bytes without a balanced end, an item is scanned string by string: no object the API stores is
# this large (etcd refuses requests over 1.5 MiB by default), so the count must have been misled by a string.
MAX_ITEM_BYTES = 4 * 2**20

_ITEMS = b'"items":['
_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[{}]', re.DOTALL)  # a whole string, or a brace outside one
_SPACE = re.compile(rb"[ \t\r\n]*")


class ListBody:
    """One LIST answer (``body``, the bytes as received): :meth:`items` decodes its items one at a time, and
    :attr:`head` is the rest (``kind``, ``apiVersion``, ``metadata``): at first the fields written before the items
    (kube-apiserver writes a built-in kind's ``metadata`` first; a custom resource's list has its keys sorted,
    ``metadata`` last), all of them once the items have been read."""

    def __init__(self, body: bytes | bytearray) -> None:
        self._body = body
        self._view = memoryview(body)
        self.head: dict[str, Any] = {}
        found = _items_start(body)  # the items' '[' and the fields before them, or None: decoded whole
        self._whole: dict[str, Any] | None = None
        if found is None:
            self._start = 0
            decoded = orjson.loads(body) if body else {}
            self._whole = decoded if isinstance(decoded, dict) else {}
        else:
            self._start, self.head = found
            self.head.pop("items", None)

    def items(self) -> Iterator[Any]:
        """The items in order, each decoded as it is asked for; afterwards :attr:`head` holds the list's fields."""
        if self._whole is not None:
            whole, self._whole = self._whole, None
            found = whole.pop("items", None) or []
            self.head = whole
            yield from found
            return
        body, view, pos = self._body, self._view, self._start + 1
        pos = _skip_space(body, pos)
        if body[pos: pos + 1] != b"]":
            key_end = body.find(b'":', pos)
            joint = b"}," + bytes(body[pos: key_end + 2]) if 0 < key_end - pos < 64 else b"},{"
            while True:
                item, end = _next_item(body, view, pos, joint)
                yield item
                del item
                pos = _skip_space(body, end)
                separator = body[pos: pos + 1]
                if separator == b"]":
                    break
                if separator != b",":
                    raise ValueError(f"a list's items are not separated by commas at byte {pos}")
                pos = _skip_space(body, pos + 1)
        head = bytes(body[: self._start]) + b"[]" + bytes(body[pos + 1:])
        self.head = orjson.loads(head)
        self.head.pop("items", None)


def _items_start(body: bytes | bytearray) -> tuple[int, dict[str, Any]] | None:
    """Where the list's top-level ``"items":[`` opens its array, and the fields before it; None: the body is to be
    decoded whole.

    ``"items":[`` may also appear inside a string before the real one; an occurrence is the list's own when what
    precedes it, closed right after an empty array, decodes as an object (a few tries at most)."""
    at = -1
    for _ in range(4):
        at = body.find(_ITEMS, at + 1)
        if at < 0:
            return None
        try:
            before = orjson.loads(bytes(body[:at]) + b'"items":[]}')
        except orjson.JSONDecodeError:
            continue
        return (at + len(_ITEMS) - 1, before) if isinstance(before, dict) else None
    return None


def _skip_space(body: bytes | bytearray, pos: int) -> int:
    match = _SPACE.match(body, pos)
    return match.end() if match else pos


def _next_item(body: bytes | bytearray, view: memoryview, start: int, joint: bytes) -> tuple[Any, int]:
    """The object that opens at ``start``, decoded, and the index just past it (see the module docstring).

    ``joint``: how one item ends and the next begins (``}`` ``,`` and the first item's opening up to its first
    key, ``{"metadata":``): looking only there skips the ``},{`` of the arrays inside an item; the last item
    ends where ``}]`` closes the list."""
    if body[start: start + 1] != b"{":
        raise ValueError(f"a list item at byte {start} is not an object")
    balance, counted, after = 0, start, start
    while True:
        candidate = body.find(joint, after)
        if candidate < 0:
            candidate = body.find(b"}]", after)
        if candidate < 0 or candidate - start > MAX_ITEM_BYTES:
            break
        end = after = candidate + 1
        balance += body.count(b"{", counted, end) - body.count(b"}", counted, end)
        counted = end
        if balance == 0:
            try:
                return orjson.loads(view[start:end]), end
            except orjson.JSONDecodeError:
                break  # the count was misled by a brace inside a string
    end = _scanned_end(body, start)
    return orjson.loads(view[start:end]), end


def _scanned_end(body: bytes | bytearray, start: int) -> int:
    """The same, found string by string: exact whatever the strings hold, several times slower."""
    depth = 0
    for match in _TOKENS.finditer(body, start):
        token = match.group()
        if token == b"{":
            depth += 1
        elif token == b"}":
            depth -= 1
            if depth == 0:
                return match.end()
    raise ValueError(f"the list item at byte {start} never ends")
