"""The HTTP API's routes under ``/v1/namespaces/{ns}/``: each checks the token's grant of the
namespace (read or write) and calls the shared AsyncMemoryClient."""

from __future__ import annotations

from typing import Annotated, Any, NamedTuple

from fastapi import APIRouter, Depends, Request, Response

from producer import validation as v
from producer.adapters.http.bodies import (
    BatchBody,
    ContextBody,
    ContextText,
    ErrorBody,
    FlushBody,
    Flushed,
    Hits,
    Neighbours,
    OrganiseBody,
    SearchBody,
    StoreBody,
    Stored,
    StoredMany,
)
from producer.adapters.http.guard import GRANT, Resources
from producer.adapters.tokens import Forbidden, Grant
from producer.async_client import AsyncMemoryClient
from producer.protocol import Note, Organised, Stats


class Target(NamedTuple):
    """What a route works on: the path's namespace, checked against the token's grant, and the
    app's shared client."""

    ns: str
    client: AsyncMemoryClient


def _target(request: Request, ns: str, use: str) -> Target:
    name = v.check_namespace(ns.replace("%2F", "/"))
    grant: Grant = request.scope[GRANT]
    if not (grant.can_read(name) if use == "read" else grant.can_write(name)):
        raise Forbidden(f"this token may not {use} namespace {name!r}")
    res: Resources = request.app.state.zettelq
    return Target(name, res.client)


async def readable(request: Request, ns: str) -> Target:
    """The path's namespace, when the request's token may read it."""
    return _target(request, ns, "read")


async def writable(request: Request, ns: str) -> Target:
    """The path's namespace, when the request's token may write it."""
    return _target(request, ns, "write")


Reader = Annotated[Target, Depends(readable)]
Writer = Annotated[Target, Depends(writable)]

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 403, 404, 413, 422, 429, 500, 503, 504)
}
api = APIRouter(prefix="/v1/namespaces/{ns}", responses=ERRORS)


@api.post("/notes", status_code=202, summary="Store one note")
async def store(to: Writer, body: StoreBody) -> Stored:
    fields = body.model_dump(exclude_none=True)
    content = fields.pop("content")
    return Stored(id=await to.client.store(content, namespace=to.ns, **fields))


@api.post("/notes:batch", status_code=202, summary="Store many notes in one write")
async def store_many(to: Writer, body: BatchBody) -> StoredMany:
    items = [note.model_dump(exclude_none=True) for note in body.notes]
    return StoredMany(ids=await to.client.store_many(items, namespace=to.ns))


@api.post("/search", summary="The best notes for a query")
async def search(on: Reader, body: SearchBody) -> Hits:
    options = body.model_dump(exclude_none=True)
    query = options.pop("query")
    return Hits(hits=await on.client.search(query, namespace=on.ns, **options))


@api.post("/context", summary="Token-budgeted text of the best notes, fenced as stored data")
async def context(on: Reader, body: ContextBody) -> ContextText:
    options = body.model_dump(exclude_none=True)
    query = options.pop("query")
    return ContextText(text=await on.client.context(query, namespace=on.ns, **options))


@api.get("/notes/{note_id}", summary="One note with its links")
async def get(on: Reader, note_id: str) -> Note:
    return await on.client.get(note_id, namespace=on.ns)


@api.delete("/notes/{note_id}", status_code=202, summary="Queue a note's deletion")
async def delete(to: Writer, note_id: str) -> Stored:
    await to.client.delete(note_id, namespace=to.ns)
    return Stored(id=note_id)


@api.get("/notes/{note_id}/connected", summary="Notes reachable over links")
async def connected(on: Reader, note_id: str, max_hops: int = 2) -> Neighbours:
    found = await on.client.connected(note_id, namespace=on.ns, max_hops=max_hops)
    return Neighbours(neighbours=found)


@api.get("/stats", summary="Counts and organisation times")
async def stats(on: Reader) -> Stats:
    return await on.client.stats(on.ns)


@api.post("/flush", summary="Return once everything stored before is organised")
async def flush(to: Writer, body: FlushBody | None = None) -> Flushed:
    await to.client.flush(to.ns, timeout_s=body.timeout_s if body else None)
    return Flushed(namespace=to.ns, flushed=True)


@api.post(
    "/organise",
    summary="Run the periodic jobs now for this namespace",
    responses={202: {"model": Organised, "description": "queued (wait=false)"}},
)
async def organise(to: Writer, response: Response, body: OrganiseBody | None = None) -> Organised:
    done = await to.client.organise(to.ns, **(body or OrganiseBody()).model_dump())
    response.status_code = 200 if done.done else 202
    return done
