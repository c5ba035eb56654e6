"""Re-embedding: bring a namespace's notes over to the configured embedder.

A projection never mixes two models' vectors: it leaves out notes whose ``embedder`` field
differs from its own embedder (see ``worker.index.projection``). After ``ZQ_EMBEDDER`` changes,
``reembed_namespace`` walks the active notes in seq order and, batch by batch, embeds the ones
written by another model (through the vector cache, outside the namespace lock so ingest is not
held up by the model), then under the lock re-reads them and, for those still unchanged, commits
the new vector and embedder, one change-log "add" entry and a "reembed" audit entry per note in
one MULTI/EXEC. Every projection then picks the batch up from the change log like any write.
Links are kept: they were judged on content, and the next write of a note relinks it.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import numpy.typing as npt

from producer import validation
from worker import vectors
from worker.context import WorkerContext
from worker.index import changelog
from worker.index.projection import catch_up
from worker.models.vector_cache import embed_cached
from worker.store import notes
from worker.store.lease import Lease

log = logging.getLogger(__name__)

#: note fields read to decide whether a note needs re-embedding and is still unchanged
FIELDS = ("content", "embedder", "status", "seq")
Row = tuple[bytes | None, ...]  #: the FIELDS of one note as HMGET returns them


def reembed_namespace(ctx: WorkerContext, ns: str, batch: int = 256) -> int:
    """Re-embed the active notes of ``ns`` whose vectors come from another embedder; return how
    many were re-embedded. Safe to run while the namespace is written to, and to run twice."""
    validation.check_namespace(ns)
    started = time.perf_counter()
    done, after = 0, -1
    while members := _active_after(ctx, ns, after, batch):
        after = members[-1][1]
        rows = _read(ctx, ns, [nid for nid, _ in members])
        stale = {nid: row for (nid, _), row in zip(members, rows, strict=True) if _stale(ctx, row)}
        if stale:
            done += _reembed_batch(ctx, ns, stale)
    proj = ctx.projection(ns)
    with proj.lock:
        catch_up(ctx, proj)
        index_stats = {"index_kind": proj.index.kind, "index_size": len(proj.index)}
    ctx.redis.hset(ctx.keys.stats(ns), mapping={**index_stats, "last_reembed": time.time()})
    log.info(
        "reembedded ns=%s n=%d embedder=%s in %.1fms",
        ns,
        done,
        ctx.embedder.name,
        (time.perf_counter() - started) * 1000,
    )
    return done


def _active_after(ctx: WorkerContext, ns: str, after: int, count: int) -> list[tuple[str, int]]:
    """Up to ``count`` active notes with a seq above ``after``, as (id, seq) in seq order."""
    members = ctx.redis.zrangebyscore(
        ctx.keys.active(ns), f"({after}", "+inf", start=0, num=count, withscores=True
    )
    return [(m.decode(), int(s)) for m, s in members]


def _read(ctx: WorkerContext, ns: str, ids: list[str]) -> list[Row]:
    pipe = ctx.redis.pipeline(transaction=False)
    for nid in ids:
        pipe.hmget(ctx.keys.note(ns, nid), list(FIELDS))
    return [tuple(row) for row in pipe.execute()]


def _stale(ctx: WorkerContext, row: Row) -> bool:
    content, embedder, status, _ = row
    return content is not None and status == b"active" and embedder != ctx.embedder.name.encode()


def _reembed_batch(ctx: WorkerContext, ns: str, stale: dict[str, Row]) -> int:
    """Embed, then commit under the namespace lock the notes that did not change meanwhile."""
    vecs = embed_cached(ctx, [(row[0] or b"").decode() for row in stale.values()])
    with (
        Lease(ctx.redis, ctx.keys.lock(ns), ctx.settings.lease_s, owner=ctx.consumer) as lease,
        lease.kept(),
    ):
        current = _read(ctx, ns, list(stale))
        keep = [
            (nid, row, vec)
            for (nid, row), now, vec in zip(stale.items(), current, vecs, strict=True)
            if now == row
        ]
        if keep:
            _commit(ctx, ns, keep)
    return len(keep)


def _commit(
    ctx: WorkerContext, ns: str, keep: list[tuple[str, Row, npt.NDArray[np.float32]]]
) -> None:
    keys, name, storage = ctx.keys, ctx.embedder.name, ctx.settings.vector_storage
    pipe = ctx.redis.pipeline(transaction=True)
    notes.changed(pipe, keys, ns)
    for nid, row, vec in keep:
        pipe.hset(
            keys.note(ns, nid), mapping={"vec": vectors.encode(vec, storage), "embedder": name}
        )
        notes.audit(
            pipe,
            keys,
            ns,
            "reembed",
            nid,
            actor="worker",
            source=f"reembed:{name}",
            before={"embedder": (row[1] or b"").decode()},
            after={"embedder": name},
        )
    items = [(int(row[3] or 0), nid) for nid, row, _ in keep]
    changelog.log_change(pipe, keys, ns, "add", items, ctx.settings.changelog_max)
    pipe.execute()
