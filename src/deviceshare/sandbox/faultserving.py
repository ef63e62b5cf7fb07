"""How the sandbox answers a request an injected fault (``faults.Fault``) matched: fail it before it is carried
out, carry it out and then fail the answer (``applied``: the write landed, the client never hears so), delay it,
hold it until the test releases it, send a ``100 Continue`` first, or cut the answer short.

Where kube-apiserver's behaviour is modelled (a write given up at its own ``timeout``, a request whose client went
away not carried out), the method says so. ``apiserver.ApiServer`` hands every faulted request here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp.web
import kmock

from deviceshare.sandbox import errors, faults, parsing

Serve = Callable[[kmock.Request], Awaitable[aiohttp.web.StreamResponse]]
Render = Callable[[Any, int, Any], aiohttp.web.Response]  # (body, status, headers) -> a JSON answer


def write_raw(request: kmock.Request, data: bytes) -> None:
    raw = request._raw_request
    if raw is not None and raw.transport is not None:
        raw.transport.write(data)


def cut_short(request: kmock.Request, response: aiohttp.web.StreamResponse) -> None:
    """The answer's head and the first half of its body, then the connection closed (``faults.Fault.cut``). The
    head gives no length, so the end of the connection is the end of the body: nothing in the framing says the
    body was cut (HTTP/1.1 allows it; a proxy that re-frames an answer may do it)."""
    raw_body = response.body if isinstance(response, aiohttp.web.Response) else None
    body = bytes(raw_body) if isinstance(raw_body, bytes | bytearray) and raw_body else b"{}"
    head = (f"HTTP/1.1 {response.status} {response.reason}\r\nContent-Type: application/json\r\n"
            f"Connection: close\r\n\r\n").encode()
    write_raw(request, head + body[: len(body) // 2])
    raw = request._raw_request
    if raw is not None and raw.transport is not None:
        raw.transport.close()
    raise faults.Dropped()


def fail(request: kmock.Request, fault: faults.Fault) -> None:
    """Answer as ``fault`` says: drop the connection, or raise its error (nothing if it only delays)."""
    if fault.drop:
        raw = request._raw_request
        if raw is not None and raw.transport is not None:
            raw.transport.close()
        raise faults.Dropped()
    error = fault.error()
    if error is not None:
        raise error


async def wait(fault: faults.Fault, deadline: float | None) -> None:
    """An injected delay before a write: past the request's own ``timeout`` the server gives up on it
    (504, not carried out), as kube-apiserver's handlers do once the request's context is done."""
    try:
        if deadline is not None and deadline < fault.delay:
            await asyncio.sleep(deadline)
            fault.given_up += 1
            raise errors.request_timeout()
        await asyncio.sleep(fault.delay)
    except asyncio.CancelledError:  # the client went away: like kube-apiserver, nothing is carried out
        fault.abandoned += 1
        raise


class FaultedRequests:
    """Serves the requests faults matched; keeps the held ones alive past their clients."""

    def __init__(self, render: Render) -> None:
        self._render = render
        self._held: set[asyncio.Task[aiohttp.web.StreamResponse]] = set()

    async def serve(self, fault: faults.Fault, request: kmock.Request, serve: Serve) -> aiohttp.web.StreamResponse:
        """``request`` answered as ``fault`` says; ``serve`` carries a request out (the store behind the API)."""
        method = str(request.method.value)
        if fault.interim:
            write_raw(request, b"HTTP/1.1 100 Continue\r\n\r\n")  # an interim answer first (faults.py)
        if fault.hold:
            return await self._hold(fault, request, serve)
        if fault.applied:
            response = await serve(request)
            if fault.delay:
                await asyncio.sleep(fault.delay)  # carried out, answered late
            if fault.cut:
                cut_short(request, response)
            fail(request, fault)
            return response
        if fault.delay:
            await wait(fault, parsing.write_deadline(method, request.params))
        fail(request, fault)
        return await serve(request)

    async def _hold(self, fault: faults.Fault, request: kmock.Request, serve: Serve) -> aiohttp.web.StreamResponse:
        """Hold the request until the test releases it, then carry it out and answer as ``fault`` says. A
        held request is already on its way (the last write of a killed process): it is served in a task of
        its own, which the client's disconnect, cancelling this handler, does not cancel. A write still held
        when its own ``timeout`` ends is given up then (504, not carried out), as kube-apiserver does."""
        loop = asyncio.get_running_loop()
        deadline = parsing.write_deadline(str(request.method.value), request.params)

        async def carry_out() -> aiohttp.web.StreamResponse:
            try:
                try:
                    await asyncio.wait_for(fault.held(), deadline)
                except TimeoutError:
                    fault.given_up += 1
                    raise errors.request_timeout() from None
                fail(request, fault)
                response = await serve(request)
            except errors.ApiError as e:
                response = self._render(e.status(), e.code, e.headers)
            fault.answered.append(response.status)
            return response

        served = loop.create_task(carry_out())
        self._held.add(served)
        served.add_done_callback(self._held.discard)
        return await asyncio.shield(served)
