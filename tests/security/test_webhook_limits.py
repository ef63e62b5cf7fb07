"""Webhook exhaustion (issue 12): what one client can cost the webhook, over real TLS.

An 8 MiB AdmissionReview, a body that never finishes, headers that trickle in, hundreds of idle
connections, JSON nested past the parser's stack, JSON that is no object: each is answered with
a 4xx or a closed connection, the memory the server holds stays bounded, and an honest review
still gets its answer afterwards.

Each test shortens only the limit it tests (to 0.5 s, or a cap of 8 connections); every other deadline
is the hang guard, so a handshake or a body that is merely slow on a busy machine is never cut off.
A deadline is checked as "not before it passed", never as "soon after": how soon is the machine's speed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import ssl
import time
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from deviceshare.api import models
from deviceshare.webhooks import admission, certs, limits, server
from tests import waiting
from tests.webhooks.test_admission import make_review, pod

Hook = tuple[server.RunningWebhook, ssl.SSLContext]
GENEROUS = limits.Limits(idle_timeout_s=waiting.HANG_GUARD, body_timeout_s=waiting.HANG_GUARD,
                         handshake_timeout_s=waiting.HANG_GUARD)
SHORT = 0.5  # the one deadline a test is about
MiB = 1024 * 1024


class NoGroups:
    """A group view that is synced and knows no group: enough to answer any review."""

    synced = True

    async def wait_synced(self, timeout_s: float) -> bool:
        return True

    async def refresh(self, namespace: str, name: str, timeout_s: float) -> None:
        return None

    def group(self, namespace: str, name: str) -> models.GroupSpec | admission.Unjoinable | None:
        return None

    def member_count(self, namespace: str, name: str) -> int:
        return 0


@pytest.fixture
def bounds() -> limits.Limits:
    """The server's limits; a test parametrizes this with the one it shortens."""
    return GENEROUS


@pytest.fixture
async def hook(tmp_path: Path, bounds: limits.Limits) -> AsyncIterator[Hook]:
    bundle = certs.generate(["127.0.0.1"])
    _, cert, key = bundle.write(tmp_path / "tls")
    running = await server.start_webhook(tls_cert=cert, tls_key=key, lookup=NoGroups(), bounds=bounds)
    try:
        yield running, ssl.create_default_context(cadata=bundle.ca_pem.decode())
    finally:
        await running.stop()


async def connect(hook: Hook) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    running, context = hook
    return await asyncio.open_connection("127.0.0.1", running.port, ssl=context)


def head(length: int | None, path: str = server.MUTATE_PATH) -> bytes:
    size = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return f"POST {path} HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n{size}\r\n\r\n".encode()


async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """Status code and the head of what the server sent before closing (a hang guard on each read)."""
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = await asyncio.wait_for(reader.read(65536), waiting.HANG_GUARD)
            if not chunk:
                break
            data += chunk
    except (ConnectionResetError, ssl.SSLError):
        pass
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0
    return status, data


async def post(hook: Hook, body: bytes, path: str = server.MUTATE_PATH) -> tuple[int, Any]:
    reader, writer = await connect(hook)
    writer.write(head(len(body), path) + body)
    await writer.drain()
    status, data = await answer(reader)
    writer.close()
    payload = data.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in data else b""
    return status, payload


async def honest(hook: Hook) -> None:
    status, _ = await post(hook, json.dumps(make_review(pod("trainer"), uid="honest")).encode())
    assert status == 200


async def test_a_declared_8_mib_body_is_413_before_it_is_read(hook: Any) -> None:
    reader, writer = await connect(hook)
    writer.write(head(8 * MiB))  # and no body at all: the answer must not wait for it (it would be a 408)
    await writer.drain()
    status, _ = await answer(reader)
    writer.close()
    assert status == 413
    await honest(hook)


async def test_a_streamed_8_mib_body_is_cut_off_and_memory_stays_bounded(hook: Any) -> None:
    reader, writer = await connect(hook)
    writer.write(head(None))
    chunk = b" " * (64 * 1024)
    tracemalloc.start()  # slows every allocation: the body deadline is the hang guard here (GENEROUS)
    sent = 0
    try:
        while sent < 8 * MiB:
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
            sent += len(chunk)
    except (ConnectionResetError, BrokenPipeError, ssl.SSLError):
        pass  # the server stopped listening: what we want
    status, _ = await answer(reader)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    writer.close()
    assert status == 413
    # The server buffers at most its 3 MiB limit plus a read chunk; the old 8 MiB limit alone held 8 MiB
    # and its parse several times that.
    assert peak < 5 * MiB, f"peak {peak / MiB:.1f} MiB while an 8 MiB body was sent"
    await honest(hook)


@pytest.mark.parametrize("bounds", [dataclasses.replace(GENEROUS, body_timeout_s=SHORT)])
async def test_a_body_that_never_finishes_is_408(hook: Any) -> None:
    reader, writer = await connect(hook)
    started = time.monotonic()
    writer.write(head(1000) + b'{"kind": "AdmissionReview"')
    await writer.drain()
    status, _ = await answer(reader)
    writer.close()
    assert status == 408
    assert time.monotonic() - started >= SHORT  # the deadline, not an early cut


@pytest.mark.parametrize("bounds", [dataclasses.replace(GENEROUS, idle_timeout_s=SHORT)])
async def test_slow_headers_and_idle_connections_are_closed(hook: Any) -> None:
    running, _ = hook
    started = time.monotonic()
    reader, writer = await connect(hook)
    writer.write(b"POST /mutate-pods HTTP/1.1\r\nHost: webhook\r\n")  # ...and the rest never comes
    await writer.drain()
    idle_reader, idle_writer = await connect(hook)  # says nothing at all
    assert await asyncio.wait_for(reader.read(), waiting.HANG_GUARD) == b""
    assert await asyncio.wait_for(idle_reader.read(), waiting.HANG_GUARD) == b""
    assert time.monotonic() - started >= SHORT  # the deadline, not an early cut
    assert running.guard.expired == 2
    writer.close()
    idle_writer.close()
    await honest(hook)


@pytest.mark.parametrize("bounds", [dataclasses.replace(GENEROUS, max_connections=8)])
async def test_connections_over_the_cap_are_closed_at_once(hook: Any, bounds: limits.Limits) -> None:
    running, _ = hook
    held = [await connect(hook) for _ in range(bounds.max_connections)]
    # The client's handshake can end before the server's: wait until the server counts them all.
    await waiting.until(lambda: running.guard.active == bounds.max_connections, "the server to count them")
    extra_reader, extra_writer = await connect(hook)
    # Closed at once: every deadline is the hang guard, so only the cap can have closed it.
    assert await asyncio.wait_for(extra_reader.read(), waiting.HANG_GUARD) == b""
    assert running.guard.refused == 1 and running.guard.expired == 0
    extra_writer.close()
    for _, writer in held:
        writer.close()
    await waiting.until(lambda: running.guard.active == 0, "the server to see the connections closed")
    await honest(hook)


@pytest.mark.parametrize("path", [server.MUTATE_PATH, server.VALIDATE_GROUPS_PATH])
@pytest.mark.parametrize("body", [
    b"[" * 200_000 + b"]" * 200_000,
    b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    b"[]", b"1", b'"AdmissionReview"', b"null", b"{not json",
], ids=["nested-arrays", "nested-objects", "array", "number", "string", "null", "garbage"])
async def test_bad_json_is_400_never_500(hook: Any, body: bytes, path: str) -> None:
    status, payload = await post(hook, body, path)
    assert status == 400, payload[:200]
    assert b"not an AdmissionReview" in payload
