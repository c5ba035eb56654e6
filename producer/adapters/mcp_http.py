"""The MCP server over streamable HTTP (``zettelq mcp --http``), each caller bound to a namespace
by its bearer token (producer/adapters/tokens.py; ``pip install 'zettelq[mcp]'``).

``http_app(settings)`` is an ASGI (Starlette) app: the MCP endpoint at ``/mcp`` and ``GET
/health``. A guard in front of the endpoint answers 401 to a missing, unknown or revoked token
before the request reaches the MCP server (a token's grant is read from Redis once, then
cached until it is revoked: producer/adapters/revocation.py), and picks the namespace the call
acts on: the one named by the ``X-Zettelq-Namespace`` header, which the token must grant (else
403), or without the header the token's one write namespace (or its one read namespace when it
writes none). Each tool then checks the grant: a write tool needs the namespace in the token's
write grant, a read tool in its read grant, else the tool error names ``Forbidden``. Errors of
the guard are JSON ``{"error": {"type": ..., "message": ...}}`` as the HTTP API's are.

A tool call of the 2026-07-28 protocol (one self-contained POST) to a tool that sends no
notifications while it runs (every tool but ``memory_store_many``, which reports progress) is
answered in JSON mode: the tool runs in the request's own task, without the response stream an
SSE reply sets up first; everything else (other methods, the progress-reporting tool, the
handshake protocols and their sessions) takes the SDK's SSE path. The JSON reply is the one the
SSE path sends for such a call; a client that hangs up does not cancel the call.

The app can be mounted in another ASGI app (the HTTP API's ``extra_mounts``) as long as that
app runs its lifespan, which runs the MCP session manager and the revocation subscription, and
closes the Redis clients.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

try:
    from mcp.server.mcpserver import Context
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS
    from starlette.applications import Starlette
    from starlette.datastructures import Headers
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.types import ASGIApp, Receive, Scope, Send
except ImportError as exc:  # pragma: no cover - only without the extra
    needs = "the MCP server needs the mcp package: pip install 'zettelq[mcp]'"
    raise ModuleNotFoundError(needs, name="mcp") from exc

from producer import validation as v
from producer.adapters.mcp import REPORTING, TOOLS, build_server
from producer.adapters.revocation import following, grant_cache
from producer.adapters.tokens import ANY, AsyncTokenStore, Forbidden, Grant, Unauthenticated
from producer.async_client import AsyncMemoryClient
from producer.connection import async_data_redis
from producer.errors import InvalidInput, Unavailable, ZettelqError
from producer.settings import ProducerSettings

MCP_PATH = "/mcp"  #: where the MCP endpoint is served by default
HEALTH_PATH = "/health"  #: liveness, without a token
NAMESPACE_HEADER = "x-zettelq-namespace"  #: picks one of the token's namespaces
ADMISSION = "zettelq_mcp"  #: key of the request's Admission in the ASGI scope's state
QUIET_TOOLS = frozenset(TOOLS) - REPORTING  #: tools answered in JSON mode (no notifications)
#: the request headers that say which protocol, method and tool a POST is for
ROUTING_HEADERS = frozenset({b"mcp-protocol-version", b"mcp-method", b"mcp-name"})
#: HTTP status of the errors the guard answers with (others: 500)
STATUS: dict[type[ZettelqError], int] = {
    Unauthenticated: 401,
    Forbidden: 403,
    InvalidInput: 400,
    Unavailable: 503,
}


@dataclass(frozen=True)
class Admission:
    """What the guard let in: the token's grant and the namespace the request acts on."""

    grant: Grant
    namespace: str


def http_app(
    settings: ProducerSettings,
    *,
    path: str = MCP_PATH,
    stateless: bool = False,
    host: str = "127.0.0.1",
) -> Starlette:
    """The MCP endpoint at ``path`` and ``GET /health``, one AsyncMemoryClient for every caller.
    ``stateless`` keeps no session between requests (replicas behind a load balancer);
    ``host`` is where it listens (loopback turns on the SDK's DNS-rebinding protection)."""
    client = AsyncMemoryClient(settings)
    redis = async_data_redis(settings, socket_timeout=settings.socket_timeout_s)
    tokens = AsyncTokenStore(redis, settings.key_prefix, grant_cache(settings))
    server = build_server(client, granted_namespace)
    server.custom_route(HEALTH_PATH, methods=["GET"])(health)
    app = server.streamable_http_app(streamable_http_path=path, stateless_http=stateless, host=host)
    sessions = app.router.lifespan_context
    sse = server.session_manager
    replies = StreamableHTTPSessionManager(
        sse.app,
        json_response=True,
        stateless=stateless,
        security_settings=sse.security_settings,
        max_request_body_size=sse.max_request_body_size,
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            async with sessions(app), replies.run(), following(settings, tokens.cache):
                yield
        finally:
            await client.aclose()
            await redis.aclose()

    app.router.lifespan_context = lifespan
    app.add_middleware(QuietCalls, replies=replies, path=path)
    app.add_middleware(TokenGuard, tokens=tokens)
    return app


async def serve(
    settings: ProducerSettings,
    *,
    host: str,
    port: int,
    path: str = MCP_PATH,
    stateless: bool = False,
) -> None:
    """Serve http_app on uvicorn at host:port until the process is told to stop."""
    import uvicorn

    app = http_app(settings, path=path, stateless=stateless, host=host)
    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False)
    await uvicorn.Server(config).serve()


def run(
    settings: ProducerSettings,
    *,
    host: str,
    port: int,
    path: str = MCP_PATH,
    stateless: bool = False,
) -> None:
    """serve() on an event loop of its own: uvloop's where it is installed (the mcp extra brings
    it with uvicorn[standard]), else asyncio's."""
    import anyio

    serving = functools.partial(
        serve, settings, host=host, port=port, path=path, stateless=stateless
    )
    anyio.run(serving, backend_options={"use_uvloop": has_uvloop()})


def has_uvloop() -> bool:
    return sys.platform != "win32" and importlib.util.find_spec("uvloop") is not None


async def health(request: Request) -> JSONResponse:
    """Liveness: the process serves (Redis is not asked)."""
    return JSONResponse({"status": "ok"})


class TokenGuard:
    """ASGI middleware: every request but ``/health`` needs a bearer token; the Admission it
    gets is left in the scope's state for the tools (see granted_namespace)."""

    def __init__(self, app: ASGIApp, tokens: AsyncTokenStore) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or route_path(scope) == HEALTH_PATH:
            await self.app(scope, receive, send)
            return
        try:
            admission = await self.admit(Headers(scope=scope))
        except ZettelqError as exc:
            await error_response(exc)(scope, receive, send)
            return
        scope.setdefault("state", {})[ADMISSION] = admission
        await self.app(scope, receive, send)

    async def admit(self, headers: Headers) -> Admission:
        scheme, _, secret = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise Unauthenticated("this endpoint needs Authorization: Bearer <token>")
        grant = await self.tokens.check(secret.strip())
        if grant is None:
            raise Unauthenticated("the token is unknown or revoked", invalid_token=True)
        return Admission(grant, choose_namespace(grant, headers.get(NAMESPACE_HEADER)))


class QuietCalls:
    """ASGI middleware: a 2026-07-28 POST to the MCP endpoint that calls one of QUIET_TOOLS goes
    to ``replies``, a session manager in JSON mode (the module's docstring says why); any other
    request goes on to the app."""

    def __init__(self, app: ASGIApp, replies: StreamableHTTPSessionManager, path: str) -> None:
        self.app = app
        self.replies = replies
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if quiet_call(scope) and route_path(scope) == self.path:
            await self.replies.handle_request(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def quiet_call(scope: Scope) -> bool:
    """Whether the request is a POST of the 2026-07-28 protocol that calls a quiet tool (the SDK
    rejects a request whose routing headers disagree with its body)."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return False
    routing = {k: v for k, v in scope["headers"] if k in ROUTING_HEADERS}
    return (
        routing.get(b"mcp-protocol-version", b"").decode("latin-1") in MODERN_PROTOCOL_VERSIONS
        and routing.get(b"mcp-method") == b"tools/call"
        and routing.get(b"mcp-name", b"").decode("latin-1") in QUIET_TOOLS
    )


def choose_namespace(grant: Grant, asked: str | None) -> str:
    """The namespace a request acts on: ``asked`` when the grant names it (or ``*``), else the
    grant's one write namespace, else its one read namespace."""
    if asked is not None:
        ns = v.check_namespace(asked)
        if not (grant.can_read(ns) or grant.can_write(ns)):
            raise Forbidden(f"the token grants no access to namespace {ns!r}")
        return ns
    for names in (grant.write, grant.read):
        exact = sorted(names - {ANY})
        if len(exact) == 1 and ANY not in names:
            return exact[0]
        if names:
            break
    raise InvalidInput(
        "the token grants several namespaces: name one in the X-Zettelq-Namespace header"
    )


def granted_namespace(ctx: Context, write: bool) -> str:
    """The Binding of the HTTP server: the request's namespace, if its token grants the use."""
    state = getattr(ctx.request_context.request, "state", None)
    admission = getattr(state, ADMISSION, None)
    if not isinstance(admission, Admission):
        raise Unauthenticated("this request carried no bearer token")
    ns = admission.namespace
    if write and not admission.grant.can_write(ns):
        raise Forbidden(f"the token may not write namespace {ns!r}")
    if not write and not admission.grant.can_read(ns):
        raise Forbidden(f"the token may not read namespace {ns!r}")
    return ns


def route_path(scope: Scope) -> str:
    """The request's path below where the app is mounted."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def error_response(exc: ZettelqError) -> JSONResponse:
    """The guard's JSON error, as the HTTP API writes them."""
    status = next((STATUS[c] for c in type(exc).__mro__ if c in STATUS), 500)
    headers = {"WWW-Authenticate": exc.challenge} if isinstance(exc, Unauthenticated) else None
    body = {"error": {"type": type(exc).__name__, "message": str(exc)}}
    return JSONResponse(body, status_code=status, headers=headers)
