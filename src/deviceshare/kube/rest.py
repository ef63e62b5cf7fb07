"""One raw request through a kubernetes_asyncio ApiClient's connection: JSON in, parsed JSON out, errors raised.

The typed API methods turn every answer into model objects (slow at 10,000 pods) and their stubs know no
content types for patches; without preloading, kubernetes_asyncio returns 4xx/5xx responses instead of
raising. Every command that talks to the API by path (operator storage, apply, inspect, explain) uses
this one function, so errors look the same everywhere.

The request goes straight to the client's own aiohttp session (its TLS settings, connection pool, proxy and
server name), with the authorization the client's configuration gives (its refresh hook included) and bodies
encoded and decoded by orjson: ``ApiClient.call_api`` walks every body and header through its model serializer
first, which cost more CPU than the request itself (about a third of each of the operator's writes).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson
from kubernetes_asyncio import client

from deviceshare.kube import http1


class ApiError(Exception):
    """The API server answered with an error status; ``message`` is its Status message."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(f"{status} {message}")
        self.status = status
        self.message = message
        self.headers: Mapping[str, str] = headers or {}


def _message(data: bytes | str | None) -> str:
    text = data.decode(errors="replace") if isinstance(data, bytes) else str(data or "")
    try:
        return str(json.loads(text).get("message", text))
    except (ValueError, AttributeError):
        return text


async def call(
    api: client.ApiClient,
    method: str,
    path: str,
    body: Any = None,
    *,
    content_type: str = "application/json",
    timeout: float | None = None,  # noqa: ASYNC109 — the HTTP client's own request timeout
    connections: http1.Connections | None = None,
    raw: bool = False,
) -> Any:
    """``method path`` with ``body``; returns the parsed JSON answer (``{}`` if empty), or with ``raw`` its bytes
    undecoded (a list's, which :mod:`listbodies` decodes item by item). ``connections``: send it over these
    (:mod:`http1`) rather than the client's aiohttp session."""
    rest = api.rest_client
    headers = {**api.default_headers, "Content-Type": content_type, "Accept": "application/json"}
    if api.cookie:
        headers["Cookie"] = api.cookie
    await api.update_params_for_auth(headers, [], ["BearerToken"])
    data = None if body is None else body if isinstance(body, bytes) else orjson.dumps(body, default=_plain)
    if connections is not None:
        answer = await connections.request(method, path, headers, data, timeout=timeout)
        if answer.status >= 400:
            raise ApiError(answer.status, _message(answer.body), dict(answer.headers))
        if raw:
            return answer.body
        return orjson.loads(answer.body) if answer.body else {}
    extra: dict[str, Any] = {}
    if rest.proxy:
        extra["proxy"] = rest.proxy
    if rest.proxy_headers:
        extra["proxy_headers"] = rest.proxy_headers
    if rest.server_hostname:
        extra["server_hostname"] = rest.server_hostname
    async with rest.pool_manager.request(
        method, f"{api.configuration.host}{path}", data=data, headers=headers, timeout=_timeout(timeout), **extra
    ) as resp:
        answer_body = await resp.read()
        if resp.status >= 400:
            raise ApiError(int(resp.status), _message(answer_body), dict(resp.headers))
    if raw:
        return answer_body
    return orjson.loads(answer_body) if answer_body else {}


def _plain(value: Any) -> Any:
    """What orjson does not encode itself: other mappings and sequences (a frozen view of a status)."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, list | tuple | set | frozenset):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


_TIMEOUTS: dict[float | None, aiohttp.ClientTimeout] = {}


def _timeout(seconds: float | None) -> aiohttp.ClientTimeout:
    """One ClientTimeout per value (the operator uses a handful)."""
    found = _TIMEOUTS.get(seconds)
    if found is None:
        found = aiohttp.ClientTimeout(total=seconds) if seconds else aiohttp.ClientTimeout()
        if len(_TIMEOUTS) < 256:
            _TIMEOUTS[seconds] = found
    return found
