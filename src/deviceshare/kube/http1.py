"""Small JSON requests over kept-alive HTTP/1.1 connections: the operator's writes, at a third of aiohttp's CPU.

aiohttp's client is general-purpose (cookies, redirects, tracing, proxies, streaming bodies, a task per request
body) and cost the operator more CPU per write than everything else the write involves: py-spy found 40% of its
busy samples in it during a burst of 2,000 placements. The API server's answers to writes are small JSON documents
on connections it keeps alive, so this client writes each request as one buffer and reads the answer in an
``asyncio.Protocol`` (``Content-Length`` or chunked framing), then puts the connection back for the next one.
What it does not do — proxies, compressed answers (it never asks for them), redirects, HTTP/2, streaming — is
left to aiohttp: :meth:`Connections.for_client` returns None where a proxy is configured, and watches and lists
stay on aiohttp.

Errors keep the distinction the operator's writes depend on (``operator/storage/transport.py``):
:class:`NotSent` — no connection could be made, the request never left; :class:`AnswerLost` — it was sent and the
connection failed before the whole answer came (it may have been applied); a timeout is ``TimeoutError`` (the
same). Both are ``aiohttp.ClientConnectionError``s, so code written for aiohttp's errors handles them alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any, cast
from urllib.parse import urlsplit

import aiohttp
from multidict import CIMultiDict

MAX_HEAD = 64 * 1024  # the status line and headers of an answer
MAX_IDLE = 64  # connections kept for reuse; more are closed once their answer is read


class NotSent(aiohttp.ClientConnectionError):
    """The connection could not be made: the request was not sent."""


class AnswerLost(aiohttp.ClientConnectionError):
    """The request was sent (or may have been) and the connection broke before its whole answer came."""


class Answer:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: CIMultiDict[str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body


class _Connection(asyncio.Protocol):
    """One connection, one request at a time; parses the answer as its bytes arrive."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = True
        self._buffer = bytearray()
        self._waiter: asyncio.Future[Answer] | None = None
        self._head: tuple[int, CIMultiDict[str]] | None = None
        self._framing = ""  # "length", "chunked" or "close"
        self._length = 0
        self._body = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self._head is not None and self._framing == "close" and exc is None:
            self._finish()  # an answer delimited by the end of the connection
        else:
            waiter.set_exception(AnswerLost(f"the connection was lost before the whole answer came ({exc!r})"))

    def send(self, data: bytes) -> asyncio.Future[Answer]:
        assert self.transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self._head, self._body = None, bytearray()
        self.transport.write(data)
        return self._waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            self.close()  # bytes nobody asked for: the connection is out of step, never reused
            return
        self._buffer += data
        try:
            self._parse()
        except ValueError as e:
            self.close()
            self._waiter.set_exception(AnswerLost(f"the answer could not be read: {e}"))

    def _parse(self) -> None:
        if self._head is None and not self._parse_head():
            return
        if self._framing == "length":
            if len(self._buffer) == self._length:  # the usual case: taken as it is, not copied (a whole list
                self._body, self._buffer = self._buffer, bytearray()  # of 140,000 pods is 230 MiB)
                self._finish()
            elif len(self._buffer) > self._length:
                self._body = self._buffer[: self._length]
                del self._buffer[: self._length]
                self._finish()
        elif self._framing == "chunked":
            self._parse_chunks()
        else:  # until the connection closes
            self._body += self._buffer
            self._buffer.clear()

    def _parse_head(self) -> bool:
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > MAX_HEAD:
                raise ValueError("its headers are too long")
            return False
        lines = bytes(self._buffer[:end]).decode("latin-1").split("\r\n")
        del self._buffer[: end + 4]
        version, _, rest = lines[0].partition(" ")
        status = int(rest[:3])
        headers: CIMultiDict[str] = CIMultiDict()
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers.add(name.strip(), value.strip())
        self._head = (status, headers)
        self.reusable = version == "HTTP/1.1" and headers.get("Connection", "").lower() != "close"
        if "chunked" in headers.get("Transfer-Encoding", "").lower():
            self._framing, self._length = "chunked", 0
        elif "Content-Length" in headers:
            self._framing, self._length = "length", int(headers["Content-Length"])
        elif status in (204, 304) or 100 <= status < 200:
            self._framing, self._length = "length", 0
        else:
            self._framing, self.reusable = "close", False
        return True

    def _parse_chunks(self) -> None:
        """``<size>[;ext]\r\n<data>\r\n`` ... ``0\r\n`` then trailer lines up to an empty one."""
        while True:
            if self._length >= 0:  # a size line is due (``_length`` is -1 once the last chunk was seen)
                line_end = self._buffer.find(b"\r\n")
                if line_end < 0:
                    return
                size = int(bytes(self._buffer[:line_end]).split(b";", 1)[0], 16)
                if size == 0:
                    del self._buffer[: line_end + 2]
                    self._length = -1
                    continue
                if len(self._buffer) < line_end + 2 + size + 2:
                    return
                self._body += self._buffer[line_end + 2: line_end + 2 + size]
                del self._buffer[: line_end + 2 + size + 2]
                continue
            line_end = self._buffer.find(b"\r\n")  # a trailer line, or the empty line that ends the answer
            if line_end < 0:
                return
            del self._buffer[: line_end + 2]
            if line_end == 0:
                self._length = 0
                self._finish()
                return

    def _finish(self) -> None:
        assert self._head is not None and self._waiter is not None
        status, headers = self._head
        self._waiter.set_result(Answer(status, headers, bytes(self._body)))
        self._head, self._body = None, bytearray()


class Connections:
    """Kept-alive connections to one API server (``host`` as in a kubeconfig: scheme, host, port, path)."""

    def __init__(self, host: str, *, ssl_context: ssl.SSLContext | None, server_hostname: str | None = None) -> None:
        url = urlsplit(host)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {host!r}")
        self._host, self._prefix = url.hostname, url.path.rstrip("/")
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._ssl = ssl_context if url.scheme == "https" else None
        self._server_hostname = server_hostname if self._ssl is not None else None
        netloc = f"[{self._host}]" if ":" in self._host else self._host
        self._host_header = netloc if url.port is None else f"{netloc}:{url.port}"
        self._idle: list[_Connection] = []

    @classmethod
    def for_client(cls, api: Any) -> Connections | None:
        """For a kubernetes_asyncio ApiClient's configuration (its CA, client certificate, verification and TLS
        server name); None where it needs what this client does not do (a proxy)."""
        cfg = getattr(api, "configuration", None)
        if cfg is None or cfg.proxy or not str(cfg.host).startswith(("http://", "https://")):
            return None
        context = None
        if str(cfg.host).startswith("https://"):
            context = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
            if cfg.cert_file:
                context.load_cert_chain(cfg.cert_file, keyfile=cfg.key_file)
            if not cfg.verify_ssl:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if getattr(cfg, "disable_strict_ssl_verification", False):
                context.verify_flags &= ~ssl.VERIFY_X509_STRICT
        return cls(str(cfg.host), ssl_context=context, server_hostname=getattr(cfg, "tls_server_name", None))

    async def request(
        self, method: str, path: str, headers: dict[str, str], body: bytes | None, *,
        timeout: float | None,  # noqa: ASYNC109 — split between connecting (not sent) and the exchange
    ) -> Answer:
        """``method path`` (path and query, already quoted); raises :class:`NotSent`, :class:`AnswerLost` or
        ``TimeoutError`` (the whole exchange, connecting included, within ``timeout`` seconds)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        try:
            async with asyncio.timeout_at(deadline):
                connection = await self._connection()
        except TimeoutError as e:
            raise NotSent(f"connecting to {self._host}:{self._port} timed out") from e
        lines = [f"{method} {self._prefix}{path} HTTP/1.1", f"Host: {self._host_header}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        lines.append(f"Content-Length: {len(body or b'')}")
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
        try:
            async with asyncio.timeout_at(deadline):
                answer = await connection.send(data)
        except BaseException:
            connection.close()  # a request may still be in flight on it: never reused
            raise
        if connection.reusable and not connection.closed and len(self._idle) < MAX_IDLE:
            self._idle.append(connection)
        else:
            connection.close()
        return answer

    async def _connection(self) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed:
                return connection
        loop = asyncio.get_running_loop()
        try:
            _, connection = await loop.create_connection(
                _Connection, self._host, self._port, ssl=self._ssl, server_hostname=self._server_hostname
            )
        except (OSError, ssl.SSLError) as e:
            raise NotSent(f"cannot connect to {self._host}:{self._port}: {e}") from e
        return connection

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
        with contextlib.suppress(Exception):
            await asyncio.sleep(0)  # let the transports' close callbacks run
