"""One HTTP/1.1 connection of :mod:`.http1`: a request written as one buffer, its answer parsed as the bytes arrive.

What RFC 9112 asks of a client reading an answer, and what it may not assume:

- **Interim answers** (``1xx``, e.g. ``100 Continue``) come before the final one and are skipped (§9.3 of RFC
  9110): taking one for the answer would read a refused write as ``{}``. ``101`` (a protocol switch we never
  ask for) is an error.
- **Framing** by ``Transfer-Encoding: chunked``, else ``Content-Length``, else the end of the connection (an
  answer that ends with its connection cannot be told from one cut short: its body is what came, and
  :func:`deviceshare.kube.rest.call` finds a cut JSON document undecodable). A connection that closes before
  ``Content-Length`` bytes or the last chunk came lost the answer.
- **Reuse** only of a connection whose answer ended exactly where its framing said: bytes after it (a server
  out of step) would be taken for the next request's answer, so that connection is closed instead.
- **Content codings**: the request says ``Accept-Encoding: identity``; a ``gzip`` answer all the same is
  inflated, any other coding is an unreadable answer (never handed on as JSON).
"""

from __future__ import annotations

import asyncio
import zlib
from typing import cast

import aiohttp
from multidict import CIMultiDict

MAX_HEAD = 64 * 1024  # the status line and headers of an answer


class NotSent(aiohttp.ClientConnectionError):
    """The request was not sent: no connection could be made (or the fence closed before it could go)."""


class AnswerLost(aiohttp.ClientConnectionError):
    """The request was sent (or may have been) and its whole answer did not come, or could not be read."""


class Answer:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: CIMultiDict[str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body


def decoded(answer: Answer) -> Answer:
    """``answer`` with its body in no content coding (``gzip`` inflated); AnswerLost for any other coding."""
    coding = answer.headers.get("Content-Encoding", "identity").strip().lower()
    if coding in ("", "identity"):
        return answer
    if coding in ("gzip", "x-gzip"):
        try:
            return Answer(answer.status, answer.headers, zlib.decompress(answer.body, wbits=31))
        except zlib.error as e:
            raise AnswerLost(f"the gzip answer could not be inflated: {e}") from e
    raise AnswerLost(f"the answer is in the content coding {coding!r}, which this client does not read")


class Connection(asyncio.Protocol):
    """One connection, one request at a time; parses the answer as its bytes arrive."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = True
        self.heard = False  # any byte of the current request's answer came
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
        self._head, self._body, self.heard = None, bytearray(), False
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
        self.heard = True
        self._buffer += data
        try:
            self._parse()
        except ValueError as e:
            self.close()
            self._waiter.set_exception(AnswerLost(f"the answer could not be read: {e}"))

    def _parse(self) -> None:
        while self._head is None:
            if not self._parse_head():
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
        """Reads one head; False when it has not all come. An interim (1xx) head is read and dropped."""
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > MAX_HEAD:
                raise ValueError("its headers are too long")
            return False
        lines = bytes(self._buffer[:end]).decode("latin-1").split("\r\n")
        del self._buffer[: end + 4]
        version, _, rest = lines[0].partition(" ")
        if not version.startswith("HTTP/1.") or not rest[:3].isdigit():
            raise ValueError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        status = int(rest[:3])
        if status == 101:
            raise ValueError("the server switched protocols (101), which was not asked for")
        if 100 <= status < 200:
            return True  # interim: the final answer follows (``_head`` stays None)
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
        elif status in (204, 304):
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
        if self._buffer:  # more than the answer came: whatever it is, it is no answer to the next request
            self.reusable = False
            self._buffer.clear()
        self._waiter.set_result(Answer(status, headers, bytes(self._body)))
        self._head, self._body = None, bytearray()
