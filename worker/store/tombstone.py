"""Tombstoning: a deleted or evicted note leaves the index and the active set, loses its vector
and its links (from both sides), keeps its hash as a tombstone, and gets an audit entry. A
delete also records its inbox entry on the id, so an older job of that id is a no-op after it.

A delete erases: the tombstone keeps id, status, times and bookkeeping but none of
ERASED_FIELDS, its audit entry names none of them, and the id is listed in ``Keys.erased`` so
the periodic audit job removes its earlier audit entries (worker/organise/audit.py). Which notes
a batch's deletes reach (atomic notes with their source) is intake's call
(worker/intake/deletes.py)."""

from __future__ import annotations

import time

from redis.client import Pipeline

from worker.context import WorkerContext
from worker.index.projection import Projection, catch_up
from worker.store import notes
from worker.store.lease import Lease

#: what a delete erases from the note's hash and audit: what the note said and who said it
ERASED_FIELDS = ("content", "keywords", "tags", "context", "metadata", "agent", "event_time")


def tombstone_notes(
    ctx: WorkerContext,
    proj: Projection,
    lease: Lease,
    existing: dict[str, notes.Fields],
    op: str,
    actors: dict[str, str],
    sources: dict[str, str],
    fences: dict[str, str] | None = None,
) -> int:
    """Tombstone notes and unlink them from both sides (delete and eviction share this); with
    ``fences``, record the deletes' entries on their ids in the same MULTI/EXEC."""
    keys, ns = ctx.keys, proj.ns
    neighbours = notes.read_links(ctx.redis, keys, ns, list(existing)) if existing else {}
    drop_tail = bool(existing) and notes.tail_among(ctx.redis, keys, ns, existing)
    with lease.fenced() as pipe:
        notes.changed(pipe, keys, ns)
        if existing:
            _tombstone(pipe, ctx, ns, existing, neighbours, op, actors, sources)
        if drop_tail:  # the next new note must not link to a tombstone
            pipe.delete(keys.tail(ns))
        notes.fence_deleted(pipe, keys, ns, fences or {})
        pipe.execute()
    if existing:
        with proj.lock:
            catch_up(ctx, proj)
    return len(existing)


def _tombstone(
    pipe: Pipeline,
    ctx: WorkerContext,
    ns: str,
    existing: dict[str, notes.Fields],
    neighbours: dict[str, dict[str, float]],
    op: str,
    actors: dict[str, str],
    sources: dict[str, str],
) -> None:
    keys = ctx.keys
    for nid in existing:
        notes.unlink_all(pipe, keys, ns, nid, neighbours[nid])
    seqs = {nid: int(fields[b"seq"]) for nid, fields in existing.items()}
    notes.tombstone_all(pipe, keys, ns, seqs, ctx.settings.changelog_max)
    erase = op == "delete"
    if erase:
        now_ms = int(time.time() * 1000)
        for nid in existing:
            pipe.hdel(keys.note(ns, nid), *ERASED_FIELDS)
        pipe.zadd(keys.erased(ns), dict.fromkeys(existing, now_ms))
    for nid, fields in existing.items():
        view = notes.public_view(notes.unpack_fields(fields))
        if erase:
            view = {k: v for k, v in view.items() if k not in ERASED_FIELDS}
        before = {**view, "links": neighbours[nid]}
        notes.audit(
            pipe,
            keys,
            ns,
            op,
            nid,
            actor=actors.get(nid, "worker"),
            source=sources.get(nid, op),
            before=before,
            after={"status": "tombstoned"},
        )
    pipe.hincrby(keys.stats(ns), "links", -notes.undirected(set(existing), neighbours))
