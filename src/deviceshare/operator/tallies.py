"""A dict that counts its entries by class through every change: what a gauge reads instead of a walk.

"How many groups are Pending, and how many wait for want of devices" must cost a scrape the number of
classes, not the number of groups. The records live in plain dicts that several modules change in place
(``state.groups[key] = ...``, ``ctx.unschedulable.pop(key, None)``); a :class:`Tally` is such a dict that
keeps the counts as it changes, so none of those writers needs to know a metric exists. Reads are the
plain dict's.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, TypeVar, overload

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
T = TypeVar("T")
_ABSENT: Any = object()


class Tally(dict[K, V]):
    """``classify(key, value)`` names an entry's class when it is stored; ``counts`` holds entries per class.

    ``on_change(old, new)`` (either None for an insertion or a removal), if set, hears every change.
    """

    def __init__(self, classify: Callable[[K, V], Hashable]) -> None:
        super().__init__()
        self._classify = classify
        self._class_of: dict[K, Hashable] = {}
        self.counts: collections.Counter[Hashable] = collections.Counter()
        self.on_change: Callable[[V | None, V | None], None] | None = None

    def __setitem__(self, key: K, value: V) -> None:
        old = dict.get(self, key, _ABSENT)
        dict.__setitem__(self, key, value)
        self._uncount(key)
        kind = self._class_of[key] = self._classify(key, value)
        self.counts[kind] += 1
        if self.on_change is not None:
            self.on_change(None if old is _ABSENT else old, value)

    def __delitem__(self, key: K) -> None:
        old = dict.pop(self, key)
        self._uncount(key)
        if self.on_change is not None:
            self.on_change(old, None)

    def _uncount(self, key: K) -> None:
        kind = self._class_of.pop(key, _ABSENT)
        if kind is not _ABSENT:
            self.counts[kind] -= 1
            if not self.counts[kind]:
                del self.counts[kind]

    @overload
    def pop(self, key: K, /) -> V: ...
    @overload
    def pop(self, key: K, default: V, /) -> V: ...
    @overload
    def pop(self, key: K, default: T, /) -> V | T: ...

    def pop(self, key: K, default: Any = _ABSENT, /) -> Any:
        if key in self:
            value = dict.__getitem__(self, key)
            del self[key]
            return value
        if default is _ABSENT:
            raise KeyError(key)
        return default

    def popitem(self) -> tuple[K, V]:
        key = next(reversed(self))
        return key, self.pop(key)

    def clear(self) -> None:
        for key in list(self):
            del self[key]

    def setdefault(self, key: K, default: V = None) -> V:  # type: ignore[assignment]
        if key not in self:
            self[key] = default
        return dict.__getitem__(self, key)

    def update(self, other: Mapping[K, V] | Iterable[tuple[K, V]] = (), /, **kw: V) -> None:  # type: ignore[override]
        pairs = other.items() if isinstance(other, Mapping) else other
        for key, value in pairs:
            self[key] = value
        for key, value in kw.items():
            self[key] = value  # type: ignore[index]

    def __ior__(self, other: Any) -> Tally[K, V]:  # type: ignore[override,misc]
        self.update(other)
        return self
