"""One raw request through a kubernetes_asyncio ApiClient: JSON in, parsed JSON out, errors raised.

The typed API methods turn every answer into model objects (slow at 10,000 pods) and their stubs know no
content types for patches; without preloading, kubernetes_asyncio returns 4xx/5xx responses instead of
raising. Every command that talks to the API by path (operator storage, apply, inspect, explain) uses
this one function, so errors look the same everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client


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
) -> Any:
    """``method path`` with ``body``; returns the parsed JSON answer (``{}`` if empty)."""
    try:
        resp = await api.call_api(
            path, method,
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
            _request_timeout=timeout,
        )
    except client.ApiException as e:  # raised by the client itself in a few paths
        raise ApiError(int(e.status or 0), _message(e.body), e.headers) from e
    try:
        data = await resp.read()
    finally:
        resp.release()
    if resp.status >= 400:
        raise ApiError(int(resp.status), _message(data), dict(resp.headers))
    return json.loads(data) if data else {}
