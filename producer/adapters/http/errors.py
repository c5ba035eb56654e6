"""The HTTP API's errors: every zettelq error as a status and a JSON body
``{"error": {"type": "<class>", "message": ...}}``, and the app's exception handlers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from producer.adapters.tokens import Forbidden, Unauthenticated
from producer.errors import (
    AccessDenied,
    Backpressure,
    Conflict,
    InvalidInput,
    JobFailed,
    NotFound,
    OutOfMemory,
    ProtocolError,
    ReplyTimeout,
    Unavailable,
    ZettelqError,
)

RETRY_AFTER_S = 1  #: Retry-After of a 429 (backpressure)


class PayloadTooLarge(InvalidInput):
    """The request body is larger than ZQ_HTTP_MAX_BODY_BYTES; nothing was read past it."""


#: HTTP status of each zettelq error (the nearest class in the error's MRO wins; others: 500)
STATUS: dict[type[ZettelqError], int] = {
    InvalidInput: 422,
    PayloadTooLarge: 413,
    Unauthenticated: 401,
    Forbidden: 403,
    NotFound: 404,
    Conflict: 409,
    Backpressure: 429,
    JobFailed: 502,
    ProtocolError: 502,
    Unavailable: 503,
    AccessDenied: 503,
    ReplyTimeout: 504,
    OutOfMemory: 507,
}


def status_of(exc: ZettelqError) -> int:
    return next((STATUS[c] for c in type(exc).__mro__ if c in STATUS), 500)


def error_response(exc: ZettelqError) -> JSONResponse:
    """The JSON error of a zettelq error, with its status and headers."""
    status = status_of(exc)
    headers: dict[str, str] = {}
    if isinstance(exc, Unauthenticated):
        headers["WWW-Authenticate"] = exc.challenge
    elif status == 429:
        headers["Retry-After"] = str(RETRY_AFTER_S)
    return error_json(status, type(exc).__name__, str(exc), headers)


def error_json(
    status: int, kind: str, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    body = {"error": {"type": kind, "message": message}}
    return JSONResponse(body, status_code=status, headers=headers)


async def on_zettelq_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ZettelqError)
    return error_response(exc)


async def on_invalid_request(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_json(400, "InvalidInput", "the request body is not valid JSON")
    return error_json(422, "InvalidInput", "; ".join(_describe(e) for e in errors[:5]))


def _describe(error: Mapping[str, Any]) -> str:
    where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
    return f"{where or 'body'}: {error.get('msg', 'invalid')}"


async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    kind = "NotFound" if exc.status_code == 404 else "InvalidInput"
    return error_json(exc.status_code, kind, str(exc.detail), exc.headers)


async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    """Anything else (say, a key of the wrong type in Redis): 500, logged by the server, with
    nothing of the exception in the response."""
    return error_json(500, "InternalError", "internal error; the server log has the details")
