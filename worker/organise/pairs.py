"""Pairs of notes for the jobs that judge two notes at a time (supersession, merge): the notes
new since a job's cursor, their nearest notes in this process's projection, and the fields
both jobs read about them.

A job's cursor is the highest seq it has looked at, kept in the namespace's stats hash, so each
run only looks at notes created (or first organised) since the last one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from worker import vectors
from worker.context import WorkerContext
from worker.index.projection import catch_up
from worker.store.notes import decode_fields

#: What both jobs read about a note (decoded with notes.decode_fields).
FIELDS = (
    "status",
    "kind",
    "content",
    "created_at",
    "event_time",
    "valid_to",
    "superseded_by",
    "access_count",
)


@dataclass(frozen=True)
class Text:
    """A note as the pair policies see it."""

    id: str
    content: str
    kind: str
    at: float  #: when it holds from: its event_time, else its creation time
    active: bool
    valid_to: float | None
    superseded_by: str | None
    access_count: int
    created_at: float
    event_time: float | None


def to_text(nid: str, f: dict[str, Any]) -> Text:
    created = float(f.get("created_at", 0.0))
    event = f.get("event_time")
    return Text(
        id=nid,
        content=f.get("content", ""),
        kind=f.get("kind", "note"),
        at=float(event) if event is not None else created,
        active=f.get("status") == "active",
        valid_to=f.get("valid_to"),
        superseded_by=f.get("superseded_by"),
        access_count=int(f.get("access_count", 0)),
        created_at=created,
        event_time=float(event) if event is not None else None,
    )


def read_texts(ctx: WorkerContext, ns: str, ids: Iterable[str]) -> dict[str, Text]:
    """The notes that exist among ``ids`` (one round trip)."""
    ids = list(dict.fromkeys(ids))
    pipe = ctx.redis.pipeline(transaction=False)
    for nid in ids:
        pipe.hmget(ctx.keys.note(ns, nid), FIELDS)
    out: dict[str, Text] = {}
    for nid, raw in zip(ids, pipe.execute(), strict=True):
        if raw[0] is not None:
            out[nid] = to_text(nid, decode_fields(list(FIELDS), raw))
    return out


def new_since(ctx: WorkerContext, ns: str, cursor: str, limit: int) -> list[tuple[str, int]]:
    """Active notes whose seq is past the job's cursor, oldest first, at most ``limit``."""
    last = ctx.redis.hget(ctx.keys.stats(ns), cursor)
    low = f"({int(last)}" if last is not None else "-inf"
    rows = ctx.redis.zrangebyscore(
        ctx.keys.active(ns), low, "+inf", start=0, num=limit, withscores=True
    )
    return [(m.decode(), int(s)) for m, s in rows]


def nearest(
    ctx: WorkerContext, ns: str, ids: Sequence[str], k: int, min_cosine: float
) -> dict[str, list[tuple[str, float]]]:
    """For each id with a vector, its up to ``k`` nearest other notes in the projection with a
    cosine of at least ``min_cosine``, nearest first."""
    pipe = ctx.redis.pipeline(transaction=False)
    for nid in ids:
        pipe.hmget(ctx.keys.note(ns, nid), ["vec", "embedder"])
    model = ctx.embedder.name.encode()
    rows = [
        (nid, vec)
        for nid, (vec, emb) in zip(ids, pipe.execute(), strict=True)
        if vec and emb == model
    ]
    if not rows:
        return {}
    vecs = np.vstack([vectors.decode(vec) for _, vec in rows])
    proj = ctx.projection(ns)
    with proj.lock:
        catch_up(ctx, proj)
        size = len(proj.index)
        if not size:
            return {}
        scores, seqs = proj.index.search(vecs, min(k + 1, size))
        found = {
            nid: [
                (proj.ids[int(q)], float(v))
                for v, q in zip(scores[i], seqs[i], strict=True)
                if q >= 0 and int(q) in proj.ids
            ]
            for i, (nid, _) in enumerate(rows)
        }
    return {
        nid: [(nb, c) for nb, c in hits if nb != nid and c >= min_cosine][:k]
        for nid, hits in found.items()
    }


def cosines(
    ctx: WorkerContext, ns: str, asked: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], float]:
    """The cosine of each asked pair whose notes both have a vector of this process's embedder
    (one round trip)."""
    ids = list(dict.fromkeys(nid for pair in asked for nid in pair))
    pipe = ctx.redis.pipeline(transaction=False)
    for nid in ids:
        pipe.hmget(ctx.keys.note(ns, nid), ["vec", "embedder"])
    model = ctx.embedder.name.encode()
    vecs = {
        nid: vectors.decode(vec)
        for nid, (vec, emb) in zip(ids, pipe.execute(), strict=True)
        if vec and emb == model
    }
    return {(a, b): float(vecs[a] @ vecs[b]) for a, b in asked if a in vecs and b in vecs}


def lexical(
    ctx: WorkerContext, ns: str, queries: dict[str, list[str]], k: int
) -> dict[str, list[str]]:
    """For each id, the up to ``k`` other notes that BM25 ranks best for its query terms
    (stemmed index terms), best first."""
    proj = ctx.projection(ns)
    with proj.lock:
        catch_up(ctx, proj)
        found = {
            nid: [proj.ids[seq] for seq, _ in proj.lexical.search(terms, k + 1) if seq in proj.ids]
            for nid, terms in queries.items()
            if terms
        }
    return {nid: [nb for nb in hits if nb != nid][:k] for nid, hits in found.items()}
