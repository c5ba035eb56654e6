"""The guard in front of the HTTP API's routes, and what every request shares."""

from __future__ import annotations

import re
from urllib.parse import unquote

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from producer.adapters.http.errors import PayloadTooLarge, error_response
from producer.adapters.revocation import grant_cache
from producer.adapters.tokens import AsyncTokenStore, Grant, Unauthenticated
from producer.async_client import AsyncMemoryClient
from producer.connection import async_data_redis
from producer.errors import InvalidInput, ZettelqError
from producer.settings import ProducerSettings

API_PREFIX = "/v1/"  #: every path the guard authenticates starts with this
GRANT = "zettelq.grant"  #: scope key under which the guard leaves the request's Grant
ENCODED_SLASH = re.compile(rb"%2[fF]")  #: a ``/`` inside a path segment


class Resources:
    """What every request shares: one AsyncMemoryClient and the token store with its grant
    cache (producer/adapters/revocation.py; the app's lifespan follows the revocations). Nothing
    connects until the first request; ``aclose`` (when the app stops) closes both."""

    def __init__(self, settings: ProducerSettings) -> None:
        self.settings = settings
        self.client = AsyncMemoryClient(settings)
        self._redis = async_data_redis(settings, socket_timeout=settings.socket_timeout_s)
        self.tokens = AsyncTokenStore(self._redis, settings.key_prefix, grant_cache(settings))

    async def aclose(self) -> None:
        await self.client.aclose()
        await self._redis.aclose()


class Guard:
    """ASGI middleware over ``/v1/``: keeps ``%2F`` inside a path segment (namespaces may hold
    ``/``), answers 401 without a valid bearer token and 413 to a body over the limit, and
    leaves the token's Grant in the scope for the routes."""

    def __init__(self, app: ASGIApp, resources: Resources) -> None:
        self.app = app
        self.resources = resources

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(API_PREFIX):
            await self.app(scope, receive, send)
            return
        try:
            grant = await self._authenticate(scope)
            body = await read_body(scope, receive, self.resources.settings.http_max_body_bytes)
        except ZettelqError as exc:
            await error_response(exc)(scope, receive, send)
            return
        scope = {**scope, "path": keep_encoded_slashes(scope), GRANT: grant}
        await self.app(scope, replay(body, receive), send)

    async def _authenticate(self, scope: Scope) -> Grant:
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, secret = header.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise Unauthenticated("a bearer token is required: Authorization: Bearer <token>")
        grant = await self.resources.tokens.check(secret.strip())
        if grant is None:
            raise Unauthenticated("the bearer token is unknown, revoked or malformed", True)
        return grant


def keep_encoded_slashes(scope: Scope) -> str:
    """The request path decoded, except that ``%2F`` stays as it is (a ``/`` in a segment)."""
    raw = scope.get("raw_path")
    if not raw:
        return str(scope["path"])
    return "%2F".join(unquote(part.decode("latin-1")) for part in ENCODED_SLASH.split(raw))


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole request body; PayloadTooLarge as soon as it is known to pass ``limit`` bytes
    (from Content-Length, or while reading)."""
    declared = dict(scope["headers"]).get(b"content-length")
    if declared is not None:
        if not declared.isdigit():
            raise InvalidInput("Content-Length is not a number")
        if int(declared) > limit:
            raise PayloadTooLarge(f"the body is {int(declared)} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > limit:
            raise PayloadTooLarge(f"the body is over the limit of {limit} bytes")
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A receive channel that gives ``body`` first, then whatever ``receive`` gives."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return again
