"""The HTTP API (``zettelq serve``; ``pip install 'zettelq[server]'``): an ASGI app on FastAPI
for agents in any language, with its OpenAPI document at ``/openapi.json`` (and ``/docs``).

Every route under ``/v1/namespaces/{ns}/`` needs ``Authorization: Bearer <token>`` (see
producer/adapters/tokens.py): read routes need the namespace in the token's read grant, write
routes in its write grant. The guard in front of the app answers 401 to a missing, unknown or
revoked token before anything else is read, and 413 to a body over ZQ_HTTP_MAX_BODY_BYTES
before it is read whole. Errors are JSON ``{"error": {"type": ..., "message": ...}}``, where
``type`` is the name of the zettelq error class (see ``errors.STATUS``). A store is what
``AsyncMemoryClient.store`` does: one Redis write (and one read for a token whose grant is not
cached, see producer/adapters/revocation.py), never a wait on a worker. A namespace with ``/``
in it is written ``%2F`` in the path.

Modules: ``guard`` (authentication and body size, in front of FastAPI; what requests share),
``routes``, ``bodies`` (request and response models) and ``errors`` (statuses and JSON errors).
See docs/http.md.
"""

from __future__ import annotations

try:
    import fastapi  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:
    raise ModuleNotFoundError(
        "the HTTP API needs FastAPI and uvicorn: pip install 'zettelq[server]'", name=exc.name
    ) from exc

from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp

from producer.adapters.http import errors
from producer.adapters.http.bodies import Health
from producer.adapters.http.guard import API_PREFIX, Guard, Resources
from producer.adapters.http.routes import api
from producer.adapters.revocation import following
from producer.errors import ZettelqError
from producer.settings import ProducerSettings

__all__ = ["create_app"]

#: the OpenAPI security scheme of every /v1/ route (the guard checks it, not a dependency)
BEARER_SCHEME = {
    "type": "http",
    "scheme": "bearer",
    "description": "a token from `zettelq token create`",
}


class ZettelqApi(FastAPI):
    """FastAPI whose OpenAPI document says that every /v1/ route needs a bearer token (the
    guard authenticates, so no route has a security dependency to say it)."""

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            schema = super().openapi()
            schema.setdefault("components", {})["securitySchemes"] = {"bearer": BEARER_SCHEME}
            for path, operations in schema["paths"].items():
                for operation in operations.values() if path.startswith(API_PREFIX) else ():
                    operation["security"] = [{"bearer": []}]
        return self.openapi_schema or {}


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
        async with AsyncExitStack() as stack:
            stack.push_async_callback(res.aclose)
            await stack.enter_async_context(following(res.settings, res.tokens.cache))
            for sub in mounts.values():
                if isinstance(sub, Starlette):
                    await stack.enter_async_context(sub.router.lifespan_context(sub))
            yield

    app = ZettelqApi(
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
    app.add_exception_handler(ZettelqError, errors.on_zettelq_error)
    app.add_exception_handler(RequestValidationError, errors.on_invalid_request)
    app.add_exception_handler(HTTPException, errors.on_http_error)
    app.add_exception_handler(Exception, errors.on_unexpected)
    app.add_middleware(Guard, resources=res)
    return app


async def health() -> Health:
    return Health(status="ok")
