"""The operator's API errors, by intent, and the fence that keeps a replica that is not the leader from writing.

API exceptions are converted once, in :mod:`.transport`, into these: ``Conflict`` (stale resourceVersion or a
precondition failed: re-read and decide again), ``Gone`` (the object no longer exists), ``Invalid`` (the API
refused the write: 400/403/415/422, the same write retried at once would be refused again), ``RetryLater`` for the
rest (retry with backoff), and for writes ``Uncertain`` (the answer was lost: it may have landed) and ``Fenced``
(not sent at all). Our own, since Kopf never sees them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class Conflict(Exception):
    """409: the object changed underneath us (or a uid/resourceVersion precondition failed)."""


class Gone(Exception):
    """404: the object was deleted."""


class Invalid(Exception):
    """400/403/415/422: the API refused what we sent (validation, admission, RBAC); not a transient error."""


class RetryLater(Exception):
    """Anything else (5xx, 429, a timeout, a dropped connection): the same request may work after ``delay``
    seconds (the server's ``Retry-After`` on a 429)."""

    def __init__(self, message: str, delay: float = 1.0) -> None:
        super().__init__(message)
        self.delay = delay


class Expired(RetryLater):
    """410: a paged list's continue token is too old (the server moved on): list again from the start."""


class TooManyRequests(RetryLater):
    """429: refused, certainly not applied. On an eviction, a PodDisruptionBudget allows no disruption now."""


class Uncertain(RetryLater):
    """A write whose answer was lost (5xx, a timeout, a dropped connection) and could not be read back: it
    may have landed. Keep everything it could have claimed, and try again later."""


class Fenced(Exception):
    """This replica may not write now (not the leader, or no longer sure to be): nothing was sent."""


class Fence(Protocol):
    def remaining(self) -> float | None:
        """Seconds a write sent now may still take to land; None: this replica must not write."""
        ...


class OpenFence:
    """A single replica (no election) writes while it runs; its writes get the ordinary request timeout."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.open = True

    def remaining(self) -> float | None:
        return self.window if self.open else None


READ_BACK_TRIES = 3  # reads of an object after an uncertain write, before giving up (Uncertain)
MIN_WRITE_WINDOW = 0.05  # s: a write that could only land in less is not sent


def translate(
    status: int, message: str, headers: Mapping[str, str] | None, what: str, *, write: bool = False,
    details: Mapping[str, Any] | None = None,
) -> Exception:
    text = f"{what}: {status} {message}"
    if status == 409:
        return Conflict(text)
    if status == 404:
        # An object's 404 names it in its details; one that names nothing is about the path: the resource type is
        # not served (yet: a CRD not established on a restarted apiserver), which says nothing of the object.
        if details is not None and not details.get("name"):
            return RetryLater(f"{text} (the resource type is not served)", delay=1.0)
        return Gone(text)
    if status == 410:
        return Expired(text)
    if status in (400, 403, 415, 422):
        return Invalid(text)
    if write and status >= 500:  # 504 Timeout says it outright: "may still be processing the request"
        return Uncertain(text)
    if status == 429:
        retry_after = (headers or {}).get("Retry-After", "")
        return TooManyRequests(text, delay=float(retry_after) if retry_after.isdigit() else 1.0)
    return RetryLater(text, delay=1.0)
