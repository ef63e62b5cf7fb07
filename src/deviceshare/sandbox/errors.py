"""API errors as kube-apiserver reports them: an HTTP code plus a ``Status`` body.

Clients (kubectl, kubernetes_asyncio, Kopf) branch on ``code`` and ``reason``, so each error
here names the same reason and message shape as the real API server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class ApiError(Exception):
    """An error the sandbox answers with a ``Status`` object instead of a result."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = dict(details or {})
        self.headers = dict(headers or {})

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def _details(name: str | None, group: str, kind: str) -> dict[str, Any]:
    details: dict[str, Any] = {"kind": kind}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    return details


def _qualified(plural: str, group: str) -> str:
    return f"{plural}.{group}" if group else plural


def not_found(plural: str, group: str, name: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{_qualified(plural, group)} "{name}" not found',
        details=_details(name, group, plural),
    )


def already_exists(plural: str, group: str, name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{_qualified(plural, group)} "{name}" already exists',
        details=_details(name, group, plural),
    )


def conflict(plural: str, group: str, name: str, why: str) -> ApiError:
    message = f'Operation cannot be fulfilled on {_qualified(plural, group)} "{name}": {why}'
    return ApiError(409, "Conflict", message, details=_details(name, group, plural))


STALE = "the object has been modified; please apply your changes to the latest version and try again"


def invalid(kind: str, group: str, name: str, causes: Sequence[tuple[str, str]]) -> ApiError:
    """422 with one cause per (field, message), worded like the real validation errors."""
    summary = ", ".join(f"{field}: {message}" if field else message for field, message in causes)
    qualified = f"{kind}.{group}" if group else kind
    detail = _details(name, group, kind)
    detail["causes"] = [
        {"reason": "FieldValueInvalid", "message": message, "field": field} for field, message in causes
    ]
    return ApiError(422, "Invalid", f'{qualified} "{name}" is invalid: {summary}', details=detail)


def forbidden(plural: str, group: str, name: str, why: str) -> ApiError:
    """403 as admission and the registry refuse: ``pods "p" is forbidden: <why>``."""
    return ApiError(
        403, "Forbidden", f'{_qualified(plural, group)} "{name}" is forbidden: {why}',
        details=_details(name, group, plural),
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def method_not_allowed(
    message: str = "the server does not allow this method on the requested resource",
) -> ApiError:
    return ApiError(405, "MethodNotAllowed", message)


def unsupported_media_type(content_type: str) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format "
        f"- accepted media types include: application/json-patch+json, "
        f"application/merge-patch+json, application/strategic-merge-patch+json "
        f"(got {content_type!r})",
    )


def internal(message: str) -> ApiError:
    return ApiError(500, "InternalError", f"Internal error occurred: {message}")


def endpoint_not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource")


def request_timeout() -> ApiError:
    """A write the server gave up on at its ``timeout`` (504; kube-apiserver's finisher, not carried out)."""
    return ApiError(
        504, "Timeout", "Timeout: request did not complete within requested timeout - context deadline exceeded",
        details={"retryAfterSeconds": 0},
    )
