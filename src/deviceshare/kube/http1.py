"""Small JSON requests over kept-alive HTTP/1.1 connections: the operator's writes, at half of aiohttp's CPU.

aiohttp's client is general-purpose (cookies, redirects, tracing, proxies, streaming bodies, a task per request
body) and cost the operator more CPU per write than everything else the write involves: py-spy found 40% of its
busy samples in it during a burst of 2,000 placements. The API server's answers to writes are small JSON documents
on connections it keeps alive, so this client writes each request as one buffer and reads the answer in an
``asyncio.Protocol`` (:mod:`.framing`), then puts the connection back for the next one. What it does not do —
proxies, redirects, HTTP/2, streaming — is left to aiohttp: :meth:`Connections.for_client` returns None where a
proxy is configured, and watches and lists stay on aiohttp.

**Liveness.** A kept-alive connection can die without a word (a control-plane node gone, a load balancer's or
conntrack's flow lost: no FIN, no RST). So: connections idle longer than :data:`IDLE_LIMIT` are not reused; TCP
keepalive and ``TCP_USER_TIMEOUT`` let the kernel find a dead peer; connecting has a timeout of its own; a request
on a kept-alive connection that times out without one byte of answer marks every idle connection suspect (they
are closed: the next request, a read-back first of all, opens a new one); a GET whose kept-alive connection closes
before any answer is sent again on a new one (as Go's transport does). The caller owns everything else: a write
that may have been applied is read back (``operator/storage/transport.py``), and the Lease has a pool of its own.

Errors keep the distinction the operator's writes depend on (``operator/storage/transport.py``):
:class:`NotSent` — no connection could be made, the request never left; :class:`AnswerLost` — it was sent and the
connection failed before the whole answer came, or the answer could not be read (it may have been applied); a
timeout is ``TimeoutError`` (the same). Both are ``aiohttp.ClientConnectionError``s, so code written for aiohttp's
errors handles them alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from deviceshare.kube import credentials, framing
from deviceshare.kube.framing import Answer, AnswerLost, NotSent

MAX_IDLE = 64  # connections kept for reuse; more are closed once their answer is read
# A kept-alive connection unused for longer is closed, not reused: below every server's own idle limit (Go's
# http.Server, kube-apiserver's: 90 s; aiohttp's server: 75 s), and aiohttp's client's (15 s), so a connection the
# server is about to close, or one a lost flow left dead while idle, is not where a request goes.
IDLE_LIMIT = 15.0
CONNECT_TIMEOUT = 10.0  # s for TCP and TLS, whatever the request's own timeout (client-go dials within 30 s)
MAX_CONNECTING = 16  # new connections being made at once: an apiserver restart meets no handshake storm
# TCP keepalive as client-go's dialer sets it (30 s), and TCP_USER_TIMEOUT: a connection whose peer is gone (no
# ACK for what was sent, or for the keepalive probes) fails in the kernel rather than waiting for ever.
KEEPALIVE_S, KEEPALIVE_PROBES, USER_TIMEOUT_MS = 30, 3, 60_000
# A GET on a kept-alive connection that hears nothing for this long is sent again on a new connection (the rest of
# its timeout): a read is safe to repeat, and a dead connection must not cost it its whole timeout.
REUSED_SILENCE = 5.0
SEND_SLACK = 1.0  # s after a fenced write's own server timeout for its answer to come back

__all__ = ["IDLE_LIMIT", "SEND_SLACK", "Answer", "AnswerLost", "Connections", "FenceClosed", "NotSent"]


class FenceClosed(NotSent):
    """The fence gave no time left once the connection was made: the write was not sent."""


def _keepalive(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        _keep_alive(sock)


def _keep_alive(sock: Any) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_S), ("TCP_KEEPINTVL", KEEPALIVE_S),
                        ("TCP_KEEPCNT", KEEPALIVE_PROBES), ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS)):
        option = getattr(socket, name, None)
        if option is not None:  # Linux has them all; other systems some
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def keepalive_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    """A socket for aiohttp's connector (its ``socket_factory``) with the same keepalive and user timeout: the
    watches' and lists' connections find a dead peer as these do."""
    family, kind, proto = addr_info[0], addr_info[1], addr_info[2]
    sock = socket.socket(family, kind, proto)
    _keep_alive(sock)
    return sock


class Connections:
    """Kept-alive connections to one API server (``host`` as in a kubeconfig: scheme, host, port, path)."""

    def __init__(
        self, host: str, *, ssl_context: ssl.SSLContext | None, server_hostname: str | None = None,
        connect_timeout: float = CONNECT_TIMEOUT, idle_limit: float = IDLE_LIMIT,
    ) -> None:
        url = urlsplit(host)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {host!r}")
        self._host, self._prefix = url.hostname, url.path.rstrip("/")
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._ssl = ssl_context if url.scheme == "https" else None
        self._server_hostname = server_hostname if self._ssl is not None else None
        netloc = f"[{self._host}]" if ":" in self._host else self._host
        self._host_header = netloc if url.port is None else f"{netloc}:{url.port}"
        self.connect_timeout, self.idle_limit, self.reused_silence = connect_timeout, idle_limit, REUSED_SILENCE
        self._idle: list[tuple[framing.Connection, float]] = []  # with when each was put back
        self._connecting = asyncio.Semaphore(MAX_CONNECTING)
        self._tls_files: credentials.TlsFiles | None = None
        self.opened = 0  # connections made
        self.silent = 0  # kept-alive connections found dead: a request on one timed out without a byte of answer

    @classmethod
    def for_client(cls, api: Any) -> Connections | None:
        """For a kubernetes_asyncio ApiClient's configuration (its CA, client certificate, verification and TLS
        server name: files read again when they change, ``credentials.TlsFiles``); None where it needs what this
        client does not do (a proxy)."""
        cfg = getattr(api, "configuration", None)
        if cfg is None or cfg.proxy or not str(cfg.host).startswith(("http://", "https://")):
            return None
        files = credentials.TlsFiles(cfg) if str(cfg.host).startswith("https://") else None
        connections = cls(str(cfg.host), ssl_context=files.context() if files else None,
                          server_hostname=getattr(cfg, "tls_server_name", None))
        connections._tls_files = files
        return connections

    async def request(
        self, method: str, path: str, headers: dict[str, str], body: bytes | None, *,
        timeout: float | None,  # noqa: ASYNC109 — split between connecting (not sent) and the exchange
        send_window: Callable[[], float | None] | None = None,
    ) -> Answer:
        """``method path`` (path and query, already quoted); raises :class:`NotSent`, :class:`AnswerLost` or
        ``TimeoutError`` (the whole exchange, connecting included, within ``timeout`` seconds).

        ``send_window``: asked once the connection is made, just before the request is written, how long the
        request may still take to be carried out (the fence's time left): None, the request is not sent
        (:class:`FenceClosed`); otherwise it goes with that as the server's ``timeout`` and its answer is waited
        for that long and :data:`SEND_SLACK` more."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        retried = False
        while True:
            connection, reused = await self._connection(deadline)
            target, until = f"{self._prefix}{path}", deadline
            if send_window is not None:
                window = send_window()
                if window is None:
                    self._put_back(connection)
                    raise FenceClosed("the fence closed while the connection was made: not sent")
                target += f"{'&' if '?' in path else '?'}timeout={int(window * 1000)}ms"
                until = min(until or float("inf"), loop.time() + window + SEND_SLACK)
            lines = [f"{method} {target} HTTP/1.1", f"Host: {self._host_header}", "Accept-Encoding: identity"]
            lines += [f"{k}: {v}" for k, v in headers.items()]
            lines.append(f"Content-Length: {len(body or b'')}")
            data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
            repeatable = reused and method == "GET" and not retried
            try:
                answer = await self._exchange(connection, data, until, repeatable)
            except TimeoutError:
                connection.close()  # a request may still be in flight on it: never reused
                if reused and not connection.heard:
                    self._found_silent()
                    if repeatable and (until is None or loop.time() < until):
                        retried = True
                        continue
                raise
            except AnswerLost:
                connection.close()
                if reused and not connection.heard and method == "GET" and not retried:
                    retried = True  # closed under a replayable request before any answer: again, as Go does
                    continue
                raise
            except BaseException:
                connection.close()
                raise
            self._put_back(connection)
            return framing.decoded(answer)

    async def _exchange(
        self, connection: framing.Connection, data: bytes, until: float | None, repeatable: bool
    ) -> Answer:
        """Send and wait for the answer until ``until``; a repeatable request hearing nothing for
        ``reused_silence`` gives up early (TimeoutError) to be sent again."""
        answer = connection.send(data)
        if repeatable:
            silence = asyncio.get_running_loop().time() + self.reused_silence
            if until is None or silence < until:
                try:
                    async with asyncio.timeout_at(silence):
                        return await asyncio.shield(answer)
                except TimeoutError:
                    if not connection.heard:
                        answer.cancel()
                        raise
        async with asyncio.timeout_at(until):
            return await answer

    def _put_back(self, connection: framing.Connection) -> None:
        if connection.reusable and not connection.closed and len(self._idle) < MAX_IDLE:
            self._idle.append((connection, asyncio.get_running_loop().time()))
        else:
            connection.close()

    def _found_silent(self) -> None:
        """A kept-alive connection said nothing: the path to the server may be gone (a node, a load balancer's
        flow), and every connection idle now was opened no later, along it: none is reused."""
        self.silent += 1
        idle, self._idle = self._idle, []
        for connection, _ in idle:
            connection.close()

    async def _connection(self, deadline: float | None) -> tuple[framing.Connection, bool]:
        """A kept-alive connection (True) or a new one (False); NotSent if none can be made in time."""
        now = asyncio.get_running_loop().time()
        while self._idle:
            connection, since = self._idle.pop()
            if connection.closed:
                continue
            if now - since > self.idle_limit:  # the newest is too old: so are the rest
                connection.close()
                for older, _ in self._idle:
                    older.close()
                self._idle.clear()
                break
            return connection, True
        limit = now + self.connect_timeout
        try:
            if self._tls_files is not None:
                self._ssl = self._tls_files.context()  # a rotated certificate or CA counts from the next connection
            async with asyncio.timeout_at(limit if deadline is None else min(limit, deadline)):
                async with self._connecting:
                    transport, connection = await asyncio.get_running_loop().create_connection(
                        framing.Connection, self._host, self._port, ssl=self._ssl,
                        server_hostname=self._server_hostname,
                    )
        except TimeoutError as e:
            raise NotSent(f"connecting to {self._host}:{self._port} timed out") from e
        except (OSError, ssl.SSLError) as e:
            raise NotSent(f"cannot connect to {self._host}:{self._port}: {e}") from e
        _keepalive(transport)
        self.opened += 1
        return connection, False

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for connection, _ in idle:
            connection.close()
        with contextlib.suppress(Exception):
            await asyncio.sleep(0)  # let the transports' close callbacks run
