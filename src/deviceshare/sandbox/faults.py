"""Scripted API failures for fault tests: the next N matching requests fail, are slowed down, or lie.

A fault matches on the HTTP method and a regular expression searched in the path (query
excluded). It answers a real ``Status`` error (409, 429 with ``Retry-After``, 500, ...) and/or
delays the request first; once it has fired ``times`` times it is spent.

Faults that lie, as kube-apiserver under load does: with ``applied`` the request is carried out first and
*then* answered with ``status`` (e.g. ``504 Timeout``: "the server ... may still be processing the
request") or, with ``drop``, not answered at all (the connection is closed after the write landed). A
``drop`` without ``applied`` closes the connection before the request is carried out. Each fault counts
how often it ``fired``, so a test can prove that it did.

Faults in the framing (issue 32): with ``interim`` an unasked-for ``100 Continue`` comes before the answer (RFC
9110 §15.2: a client must read and skip any number of 1xx answers, which a proxy or load balancer in between
may send, e.g. ``103 Early Hints``); with ``cut`` (and ``applied``) the answer's head and half its body come,
then the connection closes: the write landed, its answer cannot be read.

A ``hold`` fault keeps each request it fires on in flight until :meth:`Fault.release`, then carries it out
whether or not its client is still there (a request already on its way: a test kills the client while
its request is held, then lets it land), and ``answered`` records the status each one got, so a test
waits for the answer instead of for "long enough".
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from typing import Any

from deviceshare.sandbox import errors

_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class Dropped(Exception):
    """The connection of the request was closed by a fault: nothing is answered."""


@dataclasses.dataclass
class Fault:
    method: str | None  # "PATCH", or None for any
    path: re.Pattern[str]
    status: int | None = None  # None: only the delay, then served normally
    times: int | None = 1  # None: forever
    retry_after: float | None = None
    delay: float = 0.0
    message: str = "injected fault"
    applied: bool = False  # carry the request out first, then answer with ``status`` (or drop)
    drop: bool = False  # close the connection instead of answering
    every: int = 1  # fire on every n-th matching request only (the others are served normally)
    fired: int = 0
    seen: int = 0  # matching requests, fired or not
    given_up: int = 0  # delayed writes the server gave up on at their ``timeout`` (answered 504, not applied)
    abandoned: int = 0  # delayed requests whose client went away first (not carried out)
    hold: bool = False  # held until release(), then carried out even if the client has gone
    interim: bool = False  # a ``100 Continue`` written before whatever the answer is
    cut: bool = False  # with ``applied``: the answer's body cut in half by closing the connection
    answered: list[int] = dataclasses.field(default_factory=list)  # the status each held request got
    _released: asyncio.Event = dataclasses.field(default_factory=asyncio.Event, repr=False)

    def release(self) -> None:
        """Let the held requests (and every later one) through."""
        self._released.set()

    async def held(self) -> None:
        await self._released.wait()

    def matches(self, method: str, path: str) -> bool:
        spent = self.times is not None and self.fired >= self.times
        return (
            not spent
            and (self.method is None or self.method == method.upper())
            and bool(self.path.search(path))
        )

    def error(self) -> errors.ApiError | None:
        if self.status is None:
            return None
        headers = {"Retry-After": str(int(self.retry_after))} if self.retry_after is not None else {}
        details: dict[str, Any] = {"retryAfterSeconds": int(self.retry_after)} if self.retry_after else {}
        return errors.ApiError(
            self.status, _REASONS.get(self.status, "Unknown"), self.message, details=details, headers=headers
        )


class Faults:
    def __init__(self) -> None:
        self._faults: list[Fault] = []

    def add(self, fault: Fault) -> Fault:
        self._faults.append(fault)
        return fault

    def clear(self) -> None:
        """Remove every fault; the requests they hold go through."""
        for fault in self._faults:
            fault.release()
        self._faults.clear()

    def take(self, method: str, path: str) -> Fault | None:
        """The first live fault for this request, counted as fired."""
        for fault in self._faults:
            if fault.matches(method, path):
                fault.seen += 1
                if fault.seen % fault.every:
                    continue
                fault.fired += 1
                return fault
        return None
