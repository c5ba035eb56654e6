"""The HTTP API (``zettelq serve``; ``pip install 'zettelq[server]'``): an ASGI app on FastAPI
for agents in any language, with its OpenAPI document at ``/openapi.json`` (and ``/docs``).

Every route under ``/v1/namespaces/{ns}/`` needs ``Authorization: Bearer <token>`` (see
producer/adapters/tokens.py): read routes need the namespace in the token's read grant, write
routes in its write grant. The guard in front of the app answers 401 to a missing, unknown or
revoked token before anything else is read, and 413 to a body over ZQ_HTTP_MAX_BODY_BYTES
before it is read whole. Errors are JSON ``{"error": {"type": ..., "message": ...}}``, where
``type`` is the name of the zettelq error class (see ``STATUS``). A store is what
``AsyncMemoryClient.store`` does: one Redis write (after one read for the token), never a wait
on a worker. A namespace with ``/`` in it is written ``%2F`` in the path.

See docs/http.md.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Annotated, Any
from urllib.parse import unquote

try:
    from fastapi import APIRouter, Depends, FastAPI, Request, Response, Security
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from fastapi.security import HTTPBearer
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.types import ASGIApp, Message, Receive, Scope, Send
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ModuleNotFoundError(
        "the HTTP API needs FastAPI and uvicorn: pip install 'zettelq[server]'", name=exc.name
    ) from exc
from pydantic import BaseModel, ConfigDict, JsonValue
from redis import asyncio as aioredis

from producer import validation as v
from producer.adapters.tokens import AsyncTokenStore, Forbidden, Grant, Unauthenticated
from producer.async_client import AsyncMemoryClient
from producer.core import async_redis_kwargs
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
from producer.protocol import Hit, Neighbour, Note, Organised, Stats
from producer.settings import ProducerSettings

log = logging.getLogger(__name__)

API_PREFIX = "/v1/"  #: every path the guard authenticates starts with this
GRANT = "zettelq.grant"  #: scope key under which the guard leaves the request's Grant
ENCODED_SLASH = re.compile(rb"%2[fF]")  #: a ``/`` inside a path segment
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


# ---- request and response bodies


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StoreBody(_Body):
    """One note to store; only ``content`` is required."""

    content: str
    agent: str | None = None
    metadata: dict[str, JsonValue] | None = None
    tags: list[str] | None = None
    event_time: float | str | None = None  #: epoch seconds or ISO 8601
    importance: float | None = None
    id: str | None = None  #: makes the store idempotent


class BatchBody(_Body):
    notes: list[StoreBody]  #: 1 to ZQ_MAX_BATCH notes


class SearchBody(_Body):
    query: str
    k: int | None = None  #: 1 to ZQ_MAX_K (default 10)
    hops: int | None = None
    filters: dict[str, JsonValue] | None = None
    fresh: bool | None = None
    as_of: float | str | None = None
    diversity: float | None = None
    min_relevance: float | None = None
    weights: dict[str, float] | None = None
    timeout_s: float | None = None


class ContextBody(SearchBody):
    max_tokens: int | None = None  #: 16 to 1,000,000 (default 2000)


class FlushBody(_Body):
    timeout_s: float | None = None


class OrganiseBody(_Body):
    wait: bool = True
    timeout_s: float | None = None
    jobs: list[str] | None = None


class Stored(BaseModel):
    id: str


class StoredMany(BaseModel):
    ids: list[str]


class Hits(BaseModel):
    hits: list[Hit]


class ContextText(BaseModel):
    """Hits fenced as ``<memory>`` blocks of quoted data under a header that says so."""

    text: str


class Neighbours(BaseModel):
    neighbours: list[Neighbour]


class Flushed(BaseModel):
    namespace: str
    flushed: bool


class Health(BaseModel):
    status: str


class ErrorDetail(BaseModel):
    type: str  #: the zettelq error class, e.g. InvalidInput, Unauthenticated, NotFound
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


# ---- the guard: authentication and body size, before FastAPI reads anything


class Resources:
    """What every request shares: one AsyncMemoryClient and the token store (opened when the
    app starts, closed when it stops)."""

    def __init__(self, settings: ProducerSettings) -> None:
        self.settings = settings
        self._client: AsyncMemoryClient | None = None
        self._tokens: AsyncTokenStore | None = None
        self._redis: aioredis.Redis | None = None

    @property
    def client(self) -> AsyncMemoryClient:
        assert self._client is not None, "the app has not started"
        return self._client

    @property
    def tokens(self) -> AsyncTokenStore:
        assert self._tokens is not None, "the app has not started"
        return self._tokens

    def open(self) -> None:
        s = self.settings
        self._client = AsyncMemoryClient(s)
        self._redis = aioredis.Redis.from_url(
            s.redis_url, socket_timeout=s.socket_timeout_s, **async_redis_kwargs(s)
        )
        self._tokens = AsyncTokenStore(self._redis, s.key_prefix)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
        if self._redis is not None:
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


# ---- routes


def resources_of(request: Request) -> Resources:
    res: Resources = request.app.state.zettelq
    return res


def _namespace(ns: str) -> str:
    return v.check_namespace(ns.replace("%2F", "/"))


def readable(request: Request, ns: str) -> str:
    """The path's namespace, when the request's token may read it."""
    name = _namespace(ns)
    grant: Grant = request.scope[GRANT]
    if not grant.can_read(name):
        raise Forbidden(f"this token may not read namespace {name!r}")
    return name


def writable(request: Request, ns: str) -> str:
    """The path's namespace, when the request's token may write it."""
    name = _namespace(ns)
    grant: Grant = request.scope[GRANT]
    if not grant.can_write(name):
        raise Forbidden(f"this token may not write namespace {name!r}")
    return name


Client = Annotated[Resources, Depends(resources_of)]
ReadNs = Annotated[str, Depends(readable)]
WriteNs = Annotated[str, Depends(writable)]

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (401, 403, 404, 413, 422, 429, 503, 504)
}
bearer = HTTPBearer(description="a token from `zettelq token create`", auto_error=False)
api = APIRouter(prefix="/v1/namespaces/{ns}", dependencies=[Security(bearer)], responses=ERRORS)


@api.post("/notes", status_code=202, summary="Store one note")
async def store(ns: WriteNs, res: Client, body: StoreBody) -> Stored:
    fields = body.model_dump(exclude_none=True)
    content = fields.pop("content")
    return Stored(id=await res.client.store(content, namespace=ns, **fields))


@api.post("/notes:batch", status_code=202, summary="Store many notes in one write")
async def store_many(ns: WriteNs, res: Client, body: BatchBody) -> StoredMany:
    items = [note.model_dump(exclude_none=True) for note in body.notes]
    return StoredMany(ids=await res.client.store_many(items, namespace=ns))


@api.post("/search", summary="The best notes for a query")
async def search(ns: ReadNs, res: Client, body: SearchBody) -> Hits:
    options = body.model_dump(exclude_none=True)
    query = options.pop("query")
    return Hits(hits=await res.client.search(query, namespace=ns, **options))


@api.post("/context", summary="Token-budgeted text of the best notes, fenced as stored data")
async def context(ns: ReadNs, res: Client, body: ContextBody) -> ContextText:
    options = body.model_dump(exclude_none=True)
    query = options.pop("query")
    return ContextText(text=await res.client.context(query, namespace=ns, **options))


@api.get("/notes/{note_id}", summary="One note with its links")
async def get(ns: ReadNs, res: Client, note_id: str) -> Note:
    return await res.client.get(note_id, namespace=ns)


@api.delete("/notes/{note_id}", status_code=202, summary="Queue a note's deletion")
async def delete(ns: WriteNs, res: Client, note_id: str) -> Stored:
    await res.client.delete(note_id, namespace=ns)
    return Stored(id=note_id)


@api.get("/notes/{note_id}/connected", summary="Notes reachable over links")
async def connected(ns: ReadNs, res: Client, note_id: str, max_hops: int = 2) -> Neighbours:
    found = await res.client.connected(note_id, namespace=ns, max_hops=max_hops)
    return Neighbours(neighbours=found)


@api.get("/stats", summary="Counts and organisation times")
async def stats(ns: ReadNs, res: Client) -> Stats:
    return await res.client.stats(ns)


@api.post("/flush", summary="Return once everything stored before is organised")
async def flush(ns: WriteNs, res: Client, body: FlushBody | None = None) -> Flushed:
    await res.client.flush(ns, timeout_s=body.timeout_s if body else None)
    return Flushed(namespace=ns, flushed=True)


@api.post(
    "/organise",
    summary="Run the periodic jobs now for this namespace",
    responses={202: {"model": Organised, "description": "queued (wait=false)"}},
)
async def organise(
    ns: WriteNs, res: Client, response: Response, body: OrganiseBody | None = None
) -> Organised:
    done = await res.client.organise(ns, **(body or OrganiseBody()).model_dump())
    response.status_code = 200 if done.done else 202
    return done


# ---- the app


def create_app(
    settings: ProducerSettings | None = None, *, extra_mounts: Mapping[str, ASGIApp] | None = None
) -> FastAPI:
    """The HTTP API over one AsyncMemoryClient. ``extra_mounts`` maps paths to other ASGI apps
    served beside it (such as an MCP endpoint); a mounted Starlette app's lifespan runs with
    this app's. Their requests bypass the guard: they authenticate for themselves."""
    res = Resources(settings or ProducerSettings())
    mounts = dict(extra_mounts or {})

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        res.open()
        async with AsyncExitStack() as stack:
            stack.push_async_callback(res.aclose)
            for sub in mounts.values():
                if isinstance(sub, Starlette):
                    await stack.enter_async_context(sub.router.lifespan_context(sub))
            yield

    app = FastAPI(
        title="zettelq",
        summary="Queue-driven Zettelkasten memory for AI agents",
        version="1",
        lifespan=lifespan,
    )
    app.state.zettelq = res
    app.include_router(api)
    app.add_api_route("/health", health, methods=["GET"], summary="Liveness (no Redis check)")
    for path, sub in mounts.items():
        app.mount(path, sub)
    app.add_exception_handler(ZettelqError, _on_zettelq_error)
    app.add_exception_handler(RequestValidationError, _on_invalid_request)
    app.add_exception_handler(HTTPException, _on_http_error)
    app.add_middleware(Guard, resources=res)
    return app


async def health() -> Health:
    return Health(status="ok")


async def _on_zettelq_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ZettelqError)
    return error_response(exc)


async def _on_invalid_request(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_json(400, "InvalidInput", "the request body is not valid JSON")
    return error_json(422, "InvalidInput", "; ".join(_describe(e) for e in errors[:5]))


def _describe(error: Mapping[str, Any]) -> str:
    where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
    return f"{where or 'body'}: {error.get('msg', 'invalid')}"


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    kind = "NotFound" if exc.status_code == 404 else "InvalidInput"
    return error_json(exc.status_code, kind, str(exc.detail), exc.headers)
