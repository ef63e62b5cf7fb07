"""What keeps one client from exhausting the webhook: a connection cap and idle deadlines.

The API server is the webhook's only legitimate client, but a Service port is reachable by any pod
unless a NetworkPolicy says otherwise (manifests/base/network-policy.yaml), so the server defends
itself too:

- at most ``max_connections`` connections at once; more are closed as soon as they are accepted;
- the TLS handshake must finish within ``handshake_timeout_s``;
- a connection must deliver a request's headers within ``idle_timeout_s`` of opening or of its
  previous response, else it is closed (a slow-headers client, or an idle keep-alive connection);
- the body is then read under the server's own deadline and size limit (:mod:`server`).

aiohttp has no header timeout of its own, so each connection's protocol is wrapped by
:class:`ConnectionGuard`; the server's middleware tells the guard when a request is being handled.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from aiohttp import web


@dataclasses.dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 3 * 1024 * 1024  # a full AdmissionReview of the largest pod etcd stores
    body_timeout_s: float = 10.0
    idle_timeout_s: float = 10.0
    handshake_timeout_s: float = 10.0
    max_connections: int = 256
    large_body_bytes: int = 256 * 1024  # bodies above this are read and parsed a few at a time
    large_bodies_at_once: int = 4


class ConnectionGuard:
    """Counts connections and closes the ones that are over the cap or idle past their deadline."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.active = 0
        self.refused = 0  # connections closed because of the cap
        self.expired = 0  # connections closed because they sent no request in time
        self._open: dict[Any, _GuardedProtocol] = {}

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: _GuardedProtocol(self, inner())

    def busy(self, transport: Any) -> None:
        """A request is being handled on this connection: no idle deadline meanwhile."""
        protocol = self._open.get(transport)
        if protocol is not None:
            protocol.disarm()

    def idle(self, transport: Any) -> None:
        protocol = self._open.get(transport)
        if protocol is not None:
            protocol.arm()


class _GuardedProtocol(asyncio.Protocol):
    """Forwards everything to aiohttp's protocol; adds the cap and the idle deadline."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.BaseTransport | None = None
        self.counted = False
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if self.guard.active >= self.guard.limits.max_connections:
            self.guard.refused += 1
            transport.abort()  # type: ignore[attr-defined]
            return
        self.counted = True
        self.guard.active += 1
        self.guard._open[transport] = self
        self.inner.connection_made(transport)
        self.arm()

    def data_received(self, data: bytes) -> None:
        if self.counted:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.counted else None

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        if self.counted:
            self.counted = False
            self.guard.active -= 1
            self.guard._open.pop(self.transport, None)
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.counted:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.counted:
            self.inner.resume_writing()

    def arm(self) -> None:
        self.disarm()
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.guard.limits.idle_timeout_s, self._expire)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expire(self) -> None:
        self.timer = None
        if self.transport is not None and not self.transport.is_closing():
            self.guard.expired += 1
            self.transport.abort()  # type: ignore[attr-defined]


class GuardedSite(web.TCPSite):
    """aiohttp's TCP site with every connection wrapped by a :class:`ConnectionGuard`."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, ssl_context: Any,
                 guard: ConnectionGuard) -> None:
        super().__init__(runner, host, port, ssl_context=ssl_context)
        self.guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with the runner
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self.guard.factory(server),
            self._host,
            self._port,
            ssl=self._ssl_context,
            ssl_handshake_timeout=self.guard.limits.handshake_timeout_s if self._ssl_context else None,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
        )
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port


@web.middleware
async def deadline_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Marks the connection busy while a request is handled (see :class:`ConnectionGuard`)."""
    guard: ConnectionGuard | None = request.app.get(GUARD_KEY)
    if guard is None:
        response: web.StreamResponse = await handler(request)
        return response
    guard.busy(request.transport)
    try:
        response = await handler(request)
        return response
    finally:
        guard.idle(request.transport)


GUARD_KEY: web.AppKey[ConnectionGuard] = web.AppKey("deviceshare_connection_guard", ConnectionGuard)
