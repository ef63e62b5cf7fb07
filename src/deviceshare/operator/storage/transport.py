"""How one request reaches the API server: reads, and writes that are fenced, bounded, counted and resolved.

**A write's outcome is known before anyone acts on it.** A write whose answer is lost (a 5xx such as ``504
Timeout``, a timeout, a connection dropped after the request went out) may have landed: it is ``Uncertain``. The
writes placement depends on resolve it by reading the object back (:meth:`Transport._resolve` with a judge from
:mod:`..readback`): landed, not yet, overtaken or gone. Only when even the read-back fails does ``Uncertain``
reach the caller, who then keeps everything the write could have claimed and tries again later.

**A replica that is not the leader writes nothing.** Every write first asks the fence how long a write sent now
may still land (the leader's renew deadline counted from its last renewal); none: ``Fenced``, nothing is sent.
The time left travels with the request as kube-apiserver's ``timeout`` parameter, so the server gives up on a
write it cannot finish before this replica's leadership could end — before any successor can be elected.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import aiohttp
from kubernetes_asyncio import client as k8s

from deviceshare.api import names
from deviceshare.kube import http1, rest

from ..readback import Seen
from .errors import (
    MIN_WRITE_WINDOW,
    READ_BACK_TRIES,
    Conflict,
    Fence,
    Fenced,
    Invalid,
    OpenFence,
    RetryLater,
    Uncertain,
    translate,
)

logger = logging.getLogger(__name__)

GroupKey = tuple[str, str]
PodKey = tuple[str, str]

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


_NOW: list[tuple[int, str]] = [(0, "")]  # the last second formatted: every event and condition stamps one


def now_rfc3339() -> str:
    second = int(time.time())
    cached = _NOW[0]
    if cached[0] == second:
        return cached[1]
    text = datetime.datetime.fromtimestamp(second, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    _NOW[0] = (second, text)
    return text


class Transport:
    """Requests for one ApiClient (created at start-up, closed at cleanup)."""

    def __init__(self, api_client: k8s.ApiClient, *, request_timeout: float = 30.0) -> None:
        self._client = api_client
        # Writes and reads go over kept-alive HTTP/1.1 connections of our own (a third of aiohttp's CPU per
        # request; kube/http1.py), watches over the client's aiohttp session; None where a proxy is configured.
        self._connections = http1.Connections.for_client(api_client)
        # The Lease's requests on connections of their own (client-go gives leader election a client of its own):
        # a renewal never queues behind writes nor lands on a connection a burst of writes left dead.
        self._lease_connections = http1.Connections.for_client(api_client)
        self.lease_timeout = request_timeout  # each Lease request's; the election sets it (half its renew deadline)
        # No call may hang for ever: a stuck write would hold its group's lock.
        self.request_timeout = request_timeout
        self.watch_timeout_s = 300  # the server ends a watch after this long; it is then resumed
        self.watch_idle_s = 65.0  # a watch silent this long is taken for dead and resumed (watching.py)
        # Who may write, and for how long (the runtime installs the leader's fence when it elects).
        self.fence: Fence = OpenFence(request_timeout)
        # Each write's outcome, as (verb, resource, result): deviceshare_api_writes_total (see metrics.py).
        self.on_write: Callable[[str, str, str], None] = lambda verb, resource, result: None
        # Writes abandoned while in flight (their task cancelled) may still land until their server deadline.
        self._unsettled_until = 0.0

    async def close(self) -> None:
        for connections in (self._connections, self._lease_connections):
            if connections is not None:
                await connections.close()
        await self._client.close()

    async def _call(
        self,
        method: str,
        path: str,
        what: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        lease: bool = False,
        raw: bool = False,
    ) -> Any:
        """A read, or (``lease``) a request for the Lease, which the election guards itself: on the Lease's own
        connections and within its own timeout; a Lease write whose answer was lost is ``Uncertain``. ``raw``:
        the answer's bytes, undecoded."""
        try:
            return await rest.call(
                self._client, method, path, body, content_type=content_type,
                timeout=self.lease_timeout if lease else self.request_timeout,
                connections=self._lease_connections if lease else self._connections, raw=raw,
            )
        except rest.ApiError as e:
            raise translate(e.status, e.message, e.headers, what, details=e.details,
                            write=lease and method != "GET") from e
        except (aiohttp.ClientConnectorError, http1.NotSent) as e:
            raise RetryLater(f"{what}: {e!r}", delay=1.0) from e
        except (aiohttp.ClientError, TimeoutError) as e:
            if lease and method != "GET":
                raise Uncertain(f"{what}: the answer was lost ({type(e).__name__}: {e})") from e
            raise RetryLater(f"{what}: {e!r}", delay=1.0) from e

    async def _write(
        self,
        method: str,
        path: str,
        what: str,
        body: Any,
        *,
        verb: str,
        resource: str,
        content_type: str = "application/json",
        resolved_by_caller: bool = False,
    ) -> Any:
        """A write, fenced and bounded: sent only while this replica may write, with the server told to give it
        up once that time is over. Its outcome is counted, except an ``Uncertain`` one the caller resolves
        (``resolved_by_caller``: it counts ``uncertain_resolved`` or ``failed`` itself)."""
        deadline = time.monotonic() + self.request_timeout  # when an abandoned write is given up at the latest

        def window() -> float | None:
            """The fence's time left, asked at the moment of sending (after connecting and TLS): the write goes
            with it as the server's ``timeout``, or not at all."""
            nonlocal deadline
            left = self.fence.remaining()
            if left is None or left < MIN_WRITE_WINDOW:
                return None
            left = min(left, self.request_timeout)
            deadline = time.monotonic() + left
            return left

        if window() is None:
            self.on_write(verb, resource, "fenced")
            raise Fenced(f"{what}: not sent, this replica is not the leader")
        try:
            answer = await rest.call(
                self._client, method, path, body, content_type=content_type,
                timeout=self.request_timeout + http1.SEND_SLACK, connections=self._connections, send_window=window,
            )
        except asyncio.CancelledError:  # abandoned, not withdrawn: the server may still apply it
            self._unsettled_until = max(self._unsettled_until, deadline)
            raise
        except http1.FenceClosed as e:  # the fence closed while connecting: nothing was sent
            self.on_write(verb, resource, "fenced")
            raise Fenced(f"{what}: not sent, the fence closed while connecting") from e
        except rest.ApiError as e:
            error = translate(e.status, e.message, e.headers, what, write=True, details=e.details)
            self._count_failure(verb, resource, error, resolved_by_caller)
            raise error from e
        except (aiohttp.ClientConnectorError, http1.NotSent) as e:  # never reached the server: certainly not applied
            self.on_write(verb, resource, "failed")
            raise RetryLater(f"{what}: {e}", delay=1.0) from e
        except (aiohttp.ClientError, TimeoutError) as e:  # sent, answer lost: it may have been applied
            error = Uncertain(f"{what}: the answer was lost ({type(e).__name__}: {e})")
            self._count_failure(verb, resource, error, resolved_by_caller)
            raise error from e
        self.on_write(verb, resource, "ok")
        return answer

    async def settle(self) -> None:
        """Return once no write this client abandoned in flight can still land (its server deadline passed):
        a leader that hands its Lease over gracefully waits for this first, so its successor's rebuild sees
        every write it sent."""
        wait = self._unsettled_until - time.monotonic()
        if wait > 0:
            logger.info("waiting %.1fs for writes abandoned in flight to land or be given up", wait)
            await asyncio.sleep(wait)

    def _count_failure(self, verb: str, resource: str, error: Exception, resolved_by_caller: bool) -> None:
        if isinstance(error, Conflict):
            if not resolved_by_caller or resource != "pods/binding":  # a binding's 409 is read back too
                self.on_write(verb, resource, "conflict")
        elif not (resolved_by_caller and isinstance(error, Uncertain)):
            self.on_write(verb, resource, "failed")

    async def _resolve(
        self, what: str, verb: str, resource: str, read: Callable[[], Awaitable[dict[str, Any] | None]],
        judge: Callable[[dict[str, Any] | None], Seen],
    ) -> tuple[Seen, dict[str, Any] | None]:
        """Read the object back after an uncertain outcome and say what it shows; ``Uncertain`` if it cannot
        be read (the outcome stays unknown: the caller keeps what the write could have claimed)."""
        for attempt in range(READ_BACK_TRIES):
            try:
                body = await read()
            except RetryLater as e:
                logger.info("%s: reading it back failed (%s)", what, e)
                await asyncio.sleep(0.1 * 2**attempt)
                continue
            seen = judge(body)
            logger.info("%s: the answer was lost; read back: %s", what, seen.value)
            self.on_write(verb, resource, "uncertain_resolved")
            return seen, body
        self.on_write(verb, resource, "failed")
        raise Uncertain(f"{what}: the answer was lost and the object could not be read back")


def _segment(name: str) -> str:
    """``name`` as exactly one path segment (no name the API server accepts is empty, "." or "..")."""
    if name in ("", ".", ".."):
        raise Invalid(f"{name!r} cannot be the name of an object")
    return quote(name, safe="")


def _lease_path(own_namespace: str, name: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{_segment(own_namespace)}/leases/{_segment(name)}"


def _group_path(key: GroupKey) -> str:
    return f"/apis/{names.API_VERSION}/namespaces/{_segment(key[0])}/{names.PLURAL}/{_segment(key[1])}"


def _pod_path(key: PodKey) -> str:
    return f"/api/v1/namespaces/{_segment(key[0])}/pods/{_segment(key[1])}"
