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
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import orjson
from kubernetes_asyncio import client

from deviceshare.kube import credentials, http1


class ApiError(Exception):
    """The API server answered with an error status; ``message`` is its Status message."""

    def __init__(
        self, status: int, message: str, headers: Mapping[str, str] | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{status} {message}")
        self.status = status
        self.message = message
        self.headers: Mapping[str, str] = headers or {}
        self.details: Mapping[str, Any] = details or {}  # the Status's ``details`` (name, kind of the object)


def _error(status: int, data: bytes | str | None, headers: Mapping[str, str]) -> ApiError:
    text = data.decode(errors="replace") if isinstance(data, bytes) else str(data or "")
    try:
        status_ = json.loads(text)
        details = status_.get("details")
        return ApiError(status, str(status_.get("message", text)), headers,
                        details if isinstance(details, dict) else None)
    except (ValueError, AttributeError):
        return ApiError(status, text, headers)


def _parsed(raw: bytes) -> Any:
    """A 2xx answer's JSON; one that is not (cut short, in a coding we do not read) lost the answer: the request
    may well have been carried out, so it is never taken for a success nor for a refusal."""
    try:
        return orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError as e:
        raise http1.AnswerLost(f"the answer is no JSON document ({e})") from e


async def call(
    api: client.ApiClient,
    method: str,
    path: str,
    body: Any = None,
    *,
    content_type: str = "application/json",
    timeout: float | None = None,  # noqa: ASYNC109 — the HTTP client's own request timeout
    connections: http1.Connections | None = None,
    send_window: Callable[[], float | None] | None = None,
    raw: bool = False,
) -> Any:
    """``method path`` with ``body``; returns the parsed JSON answer (``{}`` if empty), or with ``raw`` its bytes
    undecoded (a list's, which :mod:`listbodies` decodes item by item). ``connections``: send it over these
    (:mod:`http1`) rather than the client's aiohttp session; ``send_window``: see
    :meth:`http1.Connections.request` (without ``connections`` it is asked before connecting)."""
    data = None if body is None else body if isinstance(body, bytes) else orjson.dumps(body, default=_plain)
    try:
        return await _send(api, method, path, data, content_type, timeout, connections, send_window, raw)
    except ApiError as e:
        # Refused before anything was done: with a credential that can be renewed (an exec plugin's), once more
        # with a new one, as client-go's exec authenticator does after a 401.
        if e.status != 401 or not credentials.invalidate(api.configuration):
            raise
    return await _send(api, method, path, data, content_type, timeout, connections, send_window, raw)


async def _send(
    api: client.ApiClient, method: str, path: str, data: bytes | None, content_type: str,
    timeout: float | None,  # noqa: ASYNC109 — the HTTP client's own request timeout
    connections: http1.Connections | None, send_window: Callable[[], float | None] | None, raw: bool,
) -> Any:
    rest = api.rest_client
    headers = {**api.default_headers, "Content-Type": content_type, "Accept": "application/json"}
    if api.cookie:
        headers["Cookie"] = api.cookie
    await api.update_params_for_auth(headers, [], ["BearerToken"])
    if connections is not None:
        answer = await connections.request(method, path, headers, data, timeout=timeout, send_window=send_window)
        if answer.status >= 400:
            raise _error(answer.status, answer.body, dict(answer.headers))
        return answer.body if raw else _parsed(answer.body)
    if send_window is not None:  # aiohttp connects inside the request: the window is taken before connecting
        window = send_window()
        if window is None:
            raise http1.FenceClosed("the fence is closed: not sent")
        path += f"{'&' if '?' in path else '?'}timeout={int(window * 1000)}ms"
        timeout = min(timeout or window + http1.SEND_SLACK, window + http1.SEND_SLACK)
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
            raise _error(int(resp.status), answer_body, dict(resp.headers))
    return answer_body if raw else _parsed(answer_body)


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
