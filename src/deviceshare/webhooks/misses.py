"""How often the webhook may ask the API about a group its cache does not know.

A pod that names a group the cache lacks may be racing the group's own creation (one
``kubectl apply -f`` with both), so the webhook asks the API once before it denies "does not exist".
But whoever can create pods can name any number of groups that do not exist, and each such pod would
cost the API a GET. :class:`MissLimiter` bounds that: one lookup per namespace/name per interval, and
at most ``capacity`` distinct names per interval in all; past that the miss stands and the pod is
denied without a lookup (its controller retries, and the watch has usually caught up by then). The
memory is the same bounded map: it never holds more than ``capacity`` names.

Pure: the clock is an argument, so tests move time instead of waiting for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Key = tuple[str, str]  # (namespace, name)

DEFAULT_INTERVAL_S = 5.0
DEFAULT_CAPACITY = 128  # at most 128 lookups per 5 s per webhook replica, whatever pods name


class MissLimiter:
    """Decides whether a cache miss may be looked up in the API now (see the module docstring)."""

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        capacity: int = DEFAULT_CAPACITY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self.capacity = capacity
        self._clock = clock
        self._asked: dict[Key, float] = {}  # insertion order is time order: entries are never refreshed
        self.refused = 0  # lookups refused, for tests and logs

    def admit(self, key: Key) -> bool:
        """Whether ``key`` may be looked up now; if so, it is remembered as asked."""
        now = self._clock()
        self._forget_before(now - self.interval_s)
        if key in self._asked or len(self._asked) >= self.capacity:
            self.refused += 1
            return False
        self._asked[key] = now
        return True

    def __len__(self) -> int:
        return len(self._asked)

    def _forget_before(self, cutoff: float) -> None:
        while self._asked:
            oldest = next(iter(self._asked))
            if self._asked[oldest] > cutoff:
                return
            del self._asked[oldest]
