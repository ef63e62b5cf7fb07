"""Faults below HTTP: the network between a client and the sandbox, as a TCP proxy in front of its server.

The request-level faults (``faults.py``) answer, delay or drop one request; what a real control plane's network
also does is invisible at that level:

- **A black hole** (:meth:`Front.black_hole`): a control-plane node gone, a load balancer's or conntrack's flow
  lost. The client's connection stays open (no FIN, no RST: nothing tells it), and nothing it sends arrives nor
  is anything answered; only new connections get through. A loopback proxy cannot make the kernel stop ACKing,
  so TCP keepalive and ``TCP_USER_TIMEOUT`` never fire here: what this tests is the client's own timeouts.
- **A slow TLS handshake** (``handshake_delay``): the front terminates TLS with its own certificate (the
  kubeconfig trusts its CA) and waits that long after accepting a connection before answering the
  ClientHello, as an overloaded apiserver or a TLS-terminating load balancer under a handshake storm does.

Each fault counts what it did (``black_holed``, ``swallowed``, ``slow_handshakes``), so a test proves it fired.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import cast
from urllib.parse import urlsplit


class _Link:
    """One client connection and its connection to the server; ``holed``: nothing is forwarded any more."""

    def __init__(self) -> None:
        self.holed = False
        self.tasks: list[asyncio.Task[None]] = []
        self.writers: list[asyncio.StreamWriter] = []


class Front:
    """Listens on ``host`` (a free port), forwards every connection to ``upstream`` (host, port)."""

    def __init__(
        self, upstream: tuple[str, int], *, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None,
        handshake_delay: float = 0.0,
    ) -> None:
        self._upstream, self._host, self._tls = upstream, host, tls
        self.handshake_delay = handshake_delay
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._accepting: set[asyncio.Task[None]] = set()  # connections not yet linked (a handshake held back)
        self.connections = 0  # accepted
        self.black_holed = 0  # connections swallowed by black_hole()
        self.swallowed = 0  # bytes a client sent into the hole (proof that it tried)
        self.slow_handshakes = 0  # handshakes answered only after handshake_delay
        self.handshaking = self.most_handshaking = 0  # TLS handshakes under way now, and the most at once

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"{'https' if self._tls else 'http'}://{self._host}:{self.port}"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Accepted(self), self._host, 0)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        accepting, self._accepting = list(self._accepting), set()
        for task in accepting:  # one sleeping out handshake_delay would outlive the sandbox
            task.cancel()
        for task in accepting:
            with contextlib.suppress(BaseException):
                await task
        for link in list(self._links):
            self._close(link)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None

    def black_hole(self) -> int:
        """Every connection open now stays open and forwards nothing from now on, either way; the number."""
        count = 0
        for link in self._links:
            if not link.holed:
                link.holed, count = True, count + 1
        self.black_holed += count
        return count

    def _close(self, link: _Link) -> None:
        for task in link.tasks:
            task.cancel()
        for writer in link.writers:
            writer.close()
        self._links.discard(link)

    async def _accept(self, transport: asyncio.BaseTransport) -> None:
        """A connection accepted, reading paused (what the client sent stays in the kernel for TLS to read)."""
        self.connections += 1
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(reader)
        link = _Link()
        self._links.add(link)
        try:
            if self._tls is not None:
                self.handshaking += 1
                self.most_handshaking = max(self.most_handshaking, self.handshaking)
                try:
                    if self.handshake_delay:
                        self.slow_handshakes += 1
                        await asyncio.sleep(self.handshake_delay)  # the ClientHello waits, unanswered
                    tls_transport = await loop.start_tls(
                        cast(asyncio.WriteTransport, transport), protocol, self._tls, server_side=True
                    )
                finally:
                    self.handshaking -= 1
                assert tls_transport is not None
                transport = tls_transport
            else:
                transport.set_protocol(protocol)
                cast(asyncio.ReadTransport, transport).resume_reading()
            protocol.connection_made(transport)
            writer = asyncio.StreamWriter(cast(asyncio.WriteTransport, transport), protocol, reader, loop)
            link.writers.append(writer)
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        except (OSError, ssl.SSLError, asyncio.CancelledError):
            transport.close()
            self._close(link)
            return
        link.writers.append(up_writer)
        link.tasks = [
            asyncio.create_task(self._pump(reader, up_writer, link, from_client=True)),
            asyncio.create_task(self._pump(up_reader, writer, link, from_client=False)),
        ]
        await asyncio.gather(*link.tasks, return_exceptions=True)
        self._close(link)

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, link: _Link, *, from_client: bool
    ) -> None:
        try:
            while data := await source.read(65536):
                if link.holed:
                    self.swallowed += len(data)
                    continue
                sink.write(data)
                await sink.drain()
        except (OSError, ssl.SSLError):
            pass
        if from_client or not link.holed:  # one side closed: so does the other (the server's close is holed too)
            for task in link.tasks:
                if task is not asyncio.current_task():
                    task.cancel()


class _Accepted(asyncio.Protocol):
    """Holds a new connection's bytes back until :meth:`Front._accept` has decided how to read them."""

    def __init__(self, front: Front) -> None:
        self._front = front
        self._task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.ReadTransport, transport).pause_reading()
        self._task = asyncio.get_running_loop().create_task(self._front._accept(transport))
        self._front._accepting.add(self._task)
        self._task.add_done_callback(self._front._accepting.discard)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()


def in_front_of(url: str, *, tls: ssl.SSLContext | None) -> Front:
    """A front for the server at ``url`` (``http://host:port``), serving HTTPS with ``tls`` if given."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    return Front((host, port), host=host, tls=tls)
