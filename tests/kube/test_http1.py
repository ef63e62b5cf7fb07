"""kube/http1: the operator's write client against servers that frame, split, close and stall answers as HTTP/1.1
allows, and against the sandbox over TLS. Each test says what the operator's writes depend on: the answer read
whole, the connection reused only when it is safe, and a request that never left told apart from a lost answer."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deviceshare.kube import connecting, http1, rest
from deviceshare.sandbox import Sandbox
from deviceshare.webhooks import certs

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """A TCP server whose every connection runs ``handler``; counts connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler, self.connections = handler, 0
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        finally:
            writer.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[Server]]]:
    servers: list[Server] = []

    async def start(handler: Handler) -> Server:
        s = Server(handler)
        s.server = await asyncio.start_server(s._serve, "127.0.0.1", 0)
        servers.append(s)
        return s

    yield start
    for s in servers:
        assert s.server is not None
        s.server.close()
        await s.server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return head + await reader.readexactly(length)


def answering(*answers: list[bytes], delay: float = 0.0) -> Handler:
    """Each request on a connection gets the next answer, written in the given pieces (one drain each)."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for pieces in answers:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(delay)
    return handler


def length_answer(body: bytes, status: str = "200 OK", extra: str = "") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def chunked_answer(chunks: list[bytes], trailer: str = "") -> bytes:
    out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
    for c in chunks:
        out += f"{len(c):x};ext=1\r\n".encode() + c + b"\r\n"
    return out + b"0\r\n" + trailer.encode() + b"\r\n"


async def test_a_kept_alive_connection_is_reused_and_a_closing_one_is_not(serve) -> None:  # type: ignore[no-untyped-def]
    closing = length_answer(b'{"a":2}', extra="Connection: close\r\n")
    server = await serve(answering([length_answer(b'{"a":1}')], [closing]))
    conns = http1.Connections(server.url, ssl_context=None)
    answers = [await conns.request("POST", "/x", {}, b"{}", timeout=5) for _ in range(2)]
    assert [a.body for a in answers] == [b'{"a":1}', b'{"a":2}']
    assert server.connections == 1  # the second request went over the first one's connection
    server.handler = answering([length_answer(b"{}")])
    await conns.request("GET", "/y", {}, None, timeout=5)
    assert server.connections == 2  # the server said close: a new connection
    await conns.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.binary(max_size=3000), sizes=st.lists(st.integers(1, 700), min_size=1, max_size=8),
       split=st.integers(1, 97), chunked=st.booleans())
async def test_an_answer_split_anywhere_and_framed_either_way_is_read_whole(
    serve, body: bytes, sizes: list[int], split: int, chunked: bool  # type: ignore[no-untyped-def]
) -> None:
    chunks, rest_ = [], body
    for size in sizes:
        if rest_:
            chunks.append(rest_[:size])
            rest_ = rest_[size:]
    if rest_:
        chunks.append(rest_)
    whole = chunked_answer(chunks, trailer="X-Trailer: 1\r\n") if chunked else length_answer(body)
    pieces = [whole[i:i + split] for i in range(0, len(whole), split)]
    server = await serve(answering(pieces, pieces))
    conns = http1.Connections(server.url, ssl_context=None)
    for _ in range(2):  # the second on the same connection: nothing of the first answer is left behind
        assert (await conns.request("POST", "/x", {}, b"{}", timeout=5)).body == body
    assert server.connections == 1
    await conns.close()


async def test_an_answer_without_length_ends_with_its_connection(serve) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"all\":")
        await writer.drain()
        writer.write(b"true}")
    server = await serve(handler)
    conns = http1.Connections(server.url, ssl_context=None)
    assert (await conns.request("GET", "/x", {}, None, timeout=5)).body == b'{"all":true}'
    await conns.close()


async def test_a_request_that_cannot_connect_is_not_sent(serve) -> None:  # type: ignore[no-untyped-def]
    server = await serve(answering())
    url = server.url
    assert server.server is not None
    server.server.close()
    await server.server.wait_closed()
    with pytest.raises(http1.NotSent):
        await http1.Connections(url, ssl_context=None).request("POST", "/x", {}, b"{}", timeout=5)


async def test_a_connection_dropped_mid_answer_loses_the_answer(serve) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"half")
        await writer.drain()
    server = await serve(handler)
    conns = http1.Connections(server.url, ssl_context=None)
    with pytest.raises(http1.AnswerLost):
        await conns.request("POST", "/x", {}, b"{}", timeout=5)
    await conns.close()


async def test_a_stalled_answer_times_out_and_its_connection_is_never_reused(serve) -> None:  # type: ignore[no-untyped-def]
    requests = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        while True:
            await read_request(reader)
            requests += 1
            if requests == 2:
                await asyncio.sleep(30)  # never answers this one
                return
            writer.write(length_answer(b"{}"))
            await writer.drain()
    server = await serve(handler)
    conns = http1.Connections(server.url, ssl_context=None)
    # The first request opens the connection, so the second's short timeout is all spent waiting for its answer
    # (a connection that cannot be made in time is another error, NotSent), however slow the machine.
    assert (await conns.request("POST", "/x", {}, b"{}", timeout=5)).body == b"{}"
    with pytest.raises(TimeoutError):
        await conns.request("POST", "/x", {}, b"{}", timeout=0.2)
    assert (await conns.request("POST", "/x", {}, b"{}", timeout=5)).body == b"{}"
    assert server.connections == 2  # the timed-out request's connection was closed, not reused
    await conns.close()


async def test_tls_with_the_configurations_ca_and_server_name(tmp_path: Path) -> None:
    from kubernetes_asyncio import client

    bundle = certs.generate(["api.example.test"])
    ca, cert, key = bundle.write(tmp_path / "tls")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    s = Server(answering([length_answer(b'{"tls":true}')]))
    s.server = await asyncio.start_server(s._serve, "127.0.0.1", 0, ssl=context)
    try:
        cfg = client.Configuration()
        cfg.host = f"https://127.0.0.1:{s.server.sockets[0].getsockname()[1]}"
        cfg.ssl_ca_cert, cfg.tls_server_name = str(ca), "api.example.test"
        api = client.ApiClient(cfg)
        conns = http1.Connections.for_client(api)
        assert conns is not None
        assert (await conns.request("GET", "/x", {}, None, timeout=5)).body == b'{"tls":true}'
        await conns.close()
        cfg.tls_server_name = "someone-else.test"  # the certificate does not name it: refused, never sent
        wrong = http1.Connections.for_client(api)
        assert wrong is not None
        with pytest.raises(http1.NotSent):
            await wrong.request("GET", "/x", {}, None, timeout=5)
        await api.close()
    finally:
        s.server.close()
        await s.server.wait_closed()


async def test_the_sandboxs_answers_and_refusals_through_rest_call(tmp_path: Path) -> None:
    async with Sandbox(nodes=1, gpus=1, kubeconfig_path=tmp_path / "kubeconfig") as box:
        api = await connecting.api_client(str(box.kubeconfig))
        conns = http1.Connections.for_client(api)
        assert conns is not None
        try:
            body = {"metadata": {"name": "n1"}}
            created = await rest.call(api, "POST", "/api/v1/namespaces", body, timeout=5, connections=conns)
            assert created["metadata"]["name"] == "n1"
            with pytest.raises(rest.ApiError) as refused:
                await rest.call(api, "POST", "/api/v1/namespaces", body, timeout=5, connections=conns)
            assert refused.value.status == 409 and "already exists" in refused.value.message
            listed = await rest.call(api, "GET", "/api/v1/namespaces", timeout=5, connections=conns)
            assert "n1" in {n["metadata"]["name"] for n in listed["items"]}
        finally:
            await conns.close()
            await api.close()


async def test_a_client_with_a_proxy_is_left_to_aiohttp() -> None:
    from kubernetes_asyncio import client

    cfg = client.Configuration()
    cfg.host = "https://example.invalid:6443"
    cfg.proxy = "http://proxy:3128"
    api = client.ApiClient(cfg)
    assert http1.Connections.for_client(api) is None
    await api.close()


# -- liveness: connections that die without a word --------------------------------------------------------------


class Hole:
    """Answers every request until :attr:`on`; then the connections accepted before read requests and never answer
    them (a path to the server gone, the connections kept open), while new ones answer."""

    def __init__(self) -> None:
        self.on, self.accepted, self.swallowed = False, 0, 0

    async def handler(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        born_after = self.on
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            if self.on and not born_after:
                self.swallowed += 1
                await asyncio.Event().wait()  # no answer, no close
            writer.write(length_answer(b"{}"))
            await writer.drain()


async def kept_alive(conns: http1.Connections, count: int) -> None:
    """``count`` connections made and put back idle (as many requests at once)."""
    await asyncio.gather(*(conns.request("GET", "/warm", {}, None, timeout=5) for _ in range(count)))
    assert len(conns._idle) == count


async def test_a_connection_idle_past_the_limit_is_not_reused(serve) -> None:  # type: ignore[no-untyped-def]
    hole = Hole()
    server = await serve(hole.handler)
    conns = http1.Connections(server.url, ssl_context=None, idle_limit=0.05)
    await conns.request("GET", "/x", {}, None, timeout=5)
    await conns.request("GET", "/x", {}, None, timeout=5)
    assert hole.accepted == 1  # reused while fresh
    await asyncio.sleep(0.1)  # the condition itself: longer idle than the limit
    await conns.request("GET", "/x", {}, None, timeout=5)
    assert hole.accepted == 2, "a connection idle past the limit was reused"
    await conns.close()


async def test_new_connections_have_tcp_keepalive_and_a_user_timeout(serve) -> None:  # type: ignore[no-untyped-def]
    import socket

    server = await serve(Hole().handler)
    conns = http1.Connections(server.url, ssl_context=None)
    await conns.request("GET", "/x", {}, None, timeout=5)
    connection, _ = conns._idle[0]
    assert connection.transport is not None
    sock = connection.transport.get_extra_info("socket")
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == http1.KEEPALIVE_S
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == http1.USER_TIMEOUT_MS
    await conns.close()


async def test_a_get_on_a_silent_connection_is_sent_again_on_a_new_one(serve) -> None:  # type: ignore[no-untyped-def]
    hole = Hole()
    server = await serve(hole.handler)
    conns = http1.Connections(server.url, ssl_context=None)
    conns.reused_silence = 0.2
    await kept_alive(conns, 1)
    hole.on = True
    answer = await conns.request("GET", "/x", {}, None, timeout=5)
    assert answer.body == b"{}" and hole.accepted == 2
    assert hole.swallowed == 1 and conns.silent == 1  # the fault fired: the first connection said nothing
    await conns.close()


async def test_a_write_on_a_silent_connection_times_out_and_no_idle_connection_beside_it_is_reused(
    serve  # type: ignore[no-untyped-def]
) -> None:
    hole = Hole()
    server = await serve(hole.handler)
    conns = http1.Connections(server.url, ssl_context=None)
    await kept_alive(conns, 3)
    hole.on = True  # all three dead now
    with pytest.raises(TimeoutError):  # sent: it may have been applied (the caller reads it back)
        await conns.request("PATCH", "/x", {}, b"{}", timeout=0.3)
    assert hole.swallowed == 1 and conns.silent == 1
    answer = await conns.request("GET", "/x", {}, None, timeout=5)  # a read-back: on a new connection at once
    assert answer.body == b"{}" and hole.accepted == 4 and hole.swallowed == 1
    await conns.close()


async def test_a_get_whose_kept_alive_connection_closes_unanswered_is_sent_again(serve) -> None:  # type: ignore[no-untyped-def]
    close_next, requests = False, 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal close_next, requests
        while True:
            await read_request(reader)
            requests += 1
            if close_next:
                close_next = False
                return  # closed as the request came (the server's idle close, racing it)
            writer.write(length_answer(b"{}"))
            await writer.drain()
    server = await serve(handler)
    conns = http1.Connections(server.url, ssl_context=None)
    await conns.request("GET", "/x", {}, None, timeout=5)
    close_next = True
    assert (await conns.request("GET", "/x", {}, None, timeout=5)).body == b"{}"
    assert requests == 3 and server.connections == 2  # read twice: once closed unanswered, once answered
    close_next = True
    with pytest.raises(http1.AnswerLost):  # a write is never sent twice: it may have been applied
        await conns.request("POST", "/x", {}, b"{}", timeout=5)
    assert requests == 4
    await conns.close()


# -- framing ----------------------------------------------------------------------------------------------------


async def test_an_interim_100_continue_is_not_taken_for_the_answer(serve) -> None:  # type: ignore[no-untyped-def]
    refused = length_answer(b'{"kind":"Status","message":"conflict","code":409}', status="409 Conflict")
    server = await serve(answering([b"HTTP/1.1 100 Continue\r\n\r\n", refused]))
    conns = http1.Connections(server.url, ssl_context=None)
    from kubernetes_asyncio import client

    cfg = client.Configuration()
    cfg.host = server.url
    api = client.ApiClient(cfg)
    with pytest.raises(rest.ApiError) as e:
        await rest.call(api, "PATCH", "/x", {}, timeout=5, connections=conns)
    assert e.value.status == 409
    await conns.close()
    await api.close()


async def test_bytes_after_an_answer_are_never_taken_for_the_next_one(serve) -> None:  # type: ignore[no-untyped-def]
    stale = length_answer(b'{"n":1}') + length_answer(b'{"stale":true}')
    server = await serve(answering([stale], [length_answer(b'{"n":2}')]))
    conns = http1.Connections(server.url, ssl_context=None)
    assert (await conns.request("GET", "/x", {}, None, timeout=5)).body == b'{"n":1}'
    server.handler = answering([length_answer(b'{"n":2}')])
    assert (await conns.request("GET", "/x", {}, None, timeout=5)).body == b'{"n":2}'
    assert server.connections == 2  # the out-of-step connection was closed
    await conns.close()


async def test_a_gzip_answer_is_inflated_and_an_unknown_coding_is_an_unreadable_answer(serve) -> None:  # type: ignore[no-untyped-def]
    import gzip

    seen: list[bytes] = []

    def coded(body: bytes, coding: str) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.append(await read_request(reader))
            writer.write(length_answer(body, extra=f"Content-Encoding: {coding}\r\n"))
            await writer.drain()
        return handler

    server = await serve(coded(gzip.compress(b'{"z":1}'), "gzip"))
    conns = http1.Connections(server.url, ssl_context=None)
    assert (await conns.request("GET", "/x", {}, None, timeout=5)).body == b'{"z":1}'
    assert b"accept-encoding: identity" in seen[0].lower()
    server.handler = coded(b"\x0b\x03\x80{}\x03", "br")
    with pytest.raises(http1.AnswerLost):
        await conns.request("PATCH", "/x", {}, b"{}", timeout=5)
    await conns.close()


async def test_an_answer_cut_short_by_its_connection_is_lost_not_an_error_of_ours(serve) -> None:  # type: ignore[no-untyped-def]
    from kubernetes_asyncio import client

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"metadata\":{\"resourceVers")
        await writer.drain()
    server = await serve(handler)
    cfg = client.Configuration()
    cfg.host = server.url
    api = client.ApiClient(cfg)
    conns = http1.Connections(server.url, ssl_context=None)
    with pytest.raises(http1.AnswerLost):  # sent, answered in part: it may have been applied
        await rest.call(api, "PATCH", "/x", {}, timeout=5, connections=conns)
    await conns.close()
    await api.close()
