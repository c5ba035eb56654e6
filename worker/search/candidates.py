"""Search candidates and what a search reads about them, in tiers so that a search moves as
little data as it can: ranking fields for every candidate, links for the notes a hop expands
and for those that need a connection boost, content and vectors for the hits returned. Each
tier is read from the process's row cache when the namespace's version still holds
(worker/index/rows.py), from Redis otherwise, and kept for the next search."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from producer.protocol import Hit, link_label, link_weights
from worker import vectors
from worker.bulk import BulkPipeline, fields
from worker.context import WorkerContext
from worker.index.rows import Pinned
from worker.search import ranking
from worker.search.replies import PackedHit
from worker.store.notes import decode_fields

#: Fields every candidate needs to be ranked (small: no content, no vector).
RANK_FIELDS = ("status", "importance", "last_access", "created_at", "valid_to")
#: Fields the filters need besides those (read with them when a search filters).
FILTER_FIELDS = ("kind", "agent", "tags", "event_time")
#: Fields only the returned hits need (the vector last).
HIT_FIELDS = (
    "content",
    "keywords",
    "metadata",
    "superseded_by",
    "kind",
    "agent",
    "tags",
    "event_time",
    "embedder",
    "vec",
)


class LinkRow:
    """A note's links hash as read: the packed links, their weights, and (decoded when first
    asked for, by the hits) their labels. Kept in the row cache and shared: read only."""

    def __init__(self, packed: dict[bytes, bytes]) -> None:
        self.packed = packed
        self.weights = link_weights(packed)
        self.total = ranking.link_total(self.weights)

    @cached_property
    def labels(self) -> dict[str, str]:
        return {nb.decode(): link_label(raw) for nb, raw in self.packed.items()}


@dataclass(slots=True)
class Cand:
    id: str
    ns: str
    hop: int
    fields: dict[str, Any]
    links: dict[str, float] | None = None  #: neighbour -> weight
    linked: LinkRow | None = None  #: the links hash as read (labels for the hit)
    vec: npt.NDArray[np.float32] | None = None
    similarity: float = 0.0  #: cosine with the query
    lexical: float = 0.0  #: BM25 score
    relevance: float = 0.0  #: fused channels plus graph spread
    parts: ranking.Parts | None = field(default=None, repr=False)
    score: float = 0.0  #: the composite score, set with ``parts`` by ``score()``


#: Decodes a queued read from the replies of the pipeline it was queued on.
Decoder = Callable[[list[Any]], None]
#: Each namespace's row cache as one search sees it.
Rows = Mapping[str, Pinned]
#: row cache tiers; REPLY holds each note's hit as last returned (``to_hits``)
RANK, FILTERED, LINKS, HIT, REPLY = "rank", "filtered", "links", "hit", "reply"


def fetch(
    ctx: WorkerContext,
    rows: Rows,
    ns: str,
    ids: Iterable[str],
    hop: int,
    filters: Mapping[str, Any],
    with_links: Collection[str] = (),
) -> list[Cand]:
    """Ranking fields of each id, and the links of those in ``with_links``, in one round trip
    (none when all are kept); active notes only."""
    cands = [Cand(nid, ns, hop, {}) for nid in ids]
    pipe = BulkPipeline(ctx.redis)
    active = queue_rank_fields(pipe, ctx, rows, cands, filters)
    links = queue_links(pipe, ctx, rows, [c for c in cands if c.id in with_links])
    replies = pipe.execute() if len(pipe) else []
    links(replies)
    return active(replies)


def kept_rows(rows: Rows, tier: str, cands: Iterable[Cand]) -> dict[tuple[str, str], Any]:
    """The rows of ``tier`` kept for these candidates, by (namespace, id)."""
    ids: dict[str, list[str]] = {}
    for c in cands:
        ids.setdefault(c.ns, []).append(c.id)
    return {
        (ns, nid): row
        for ns, group in ids.items()
        for nid, row in rows[ns].get_many(tier, group).items()
    }


def queue_rank_fields(
    pipe: BulkPipeline,
    ctx: WorkerContext,
    rows: Rows,
    cands: list[Cand],
    filters: Mapping[str, Any],
) -> Callable[[list[Any]], list[Cand]]:
    """Queue the read of the candidates' ranking fields, and of those the filters need, for the
    candidates whose rows are not kept; its decoder returns the active candidates."""
    names, tier = list(RANK_FIELDS), RANK
    if filters:
        names += (*FILTER_FIELDS, "metadata")
        tier = FILTERED
    kept = kept_rows(rows, tier, cands)
    todo = [c for c in cands if (c.ns, c.id) not in kept]
    start = len(pipe)
    for c in todo:
        pipe.queue("HMGET", ctx.keys.note(c.ns, c.id), *names)

    def decoder(replies: list[Any]) -> list[Cand]:
        for c, raw in zip(todo, replies[start : start + len(todo)], strict=True):
            kept[c.ns, c.id] = decode_fields(names, raw)
            rows[c.ns].put(tier, c.id, kept[c.ns, c.id])
        out = []
        for c in cands:
            got = kept[c.ns, c.id]
            if got.get("status") == "active":
                c.fields.update(got)
                out.append(c)
        return out

    return decoder


def queue_links(
    pipe: BulkPipeline, ctx: WorkerContext, rows: Rows, cands: Iterable[Cand]
) -> Decoder:
    """Queue the read of the links hashes of the candidates that lack them and whose rows are
    not kept (those are filled in at once). The links are shared with the cache: read only."""
    bare = [c for c in cands if c.links is None]
    kept = kept_rows(rows, LINKS, bare)
    todo = []
    for c in bare:
        got = kept.get((c.ns, c.id))
        if got is None:
            todo.append(c)
        else:
            c.linked, c.links = got, got.weights
    start = len(pipe)
    for c in todo:
        pipe.queue("HGETALL", ctx.keys.links(c.ns, c.id))

    def decoder(replies: list[Any]) -> None:
        for c, row in zip(todo, replies[start : start + len(todo)], strict=True):
            c.linked = LinkRow(fields(row))
            c.links = c.linked.weights
            rows[c.ns].put(LINKS, c.id, c.linked)

    return decoder


def load_links(ctx: WorkerContext, rows: Rows, cands: Iterable[Cand]) -> None:
    """Fill in the links of the candidates that lack them (one round trip, none if none do)."""
    pipe = BulkPipeline(ctx.redis)
    decoder = queue_links(pipe, ctx, rows, cands)
    if len(pipe):
        decoder(pipe.execute())


def queue_hit_fields(
    pipe: BulkPipeline,
    ctx: WorkerContext,
    rows: Rows,
    cands: Iterable[Cand],
    qvec: npt.NDArray[np.float32],
    embedder: str,
) -> Decoder:
    """Queue the read of what the candidates lack to be returned as hits: content, keywords,
    metadata, vector, links (with their labels). The decoder also sets the similarity to the
    query from the stored vector when it comes from the current embedder."""
    cands = list(cands)
    bare = [c for c in cands if "content" not in c.fields]
    kept = kept_rows(rows, HIT, bare)
    todo = [c for c in bare if (c.ns, c.id) not in kept]
    start = len(pipe)
    for c in todo:
        pipe.queue("HMGET", ctx.keys.note(c.ns, c.id), *HIT_FIELDS)
    links = queue_links(pipe, ctx, rows, cands)

    def decoder(replies: list[Any]) -> None:
        for c, raw in zip(todo, replies[start : start + len(todo)], strict=True):
            got = decode_fields(list(HIT_FIELDS[:-1]), raw[:-1])
            vec = raw[-1] if got.get("embedder") == embedder else None
            kept[c.ns, c.id] = (got, None if vec is None else vectors.decode(vec))
            rows[c.ns].put(HIT, c.id, kept[c.ns, c.id])
        for c in bare:
            got, c.vec = kept[c.ns, c.id]
            c.fields.update(got)
            if c.vec is not None:
                c.similarity = float(c.vec @ qvec[0])
        links(replies)

    return decoder


def load_hit_fields(
    ctx: WorkerContext,
    rows: Rows,
    cands: list[Cand],
    qvec: npt.NDArray[np.float32],
    embedder: str,
) -> None:
    """What ``queue_hit_fields`` reads, for the candidates that lack it (one round trip, none if
    none do)."""
    pipe = BulkPipeline(ctx.redis)
    decoder = queue_hit_fields(pipe, ctx, rows, cands, qvec, embedder)
    decoder(pipe.execute() if len(pipe) else [])  # kept rows are filled in by the decoder too


def passes(c: Cand, filters: dict[str, Any]) -> bool:
    """Whether the candidate meets every filter (agent, kind, tags, since/until, as_of,
    metadata)."""
    f = c.fields
    if not filters:
        return True
    if "agent" in filters and f.get("agent") != filters["agent"]:
        return False
    if "kind" in filters and f.get("kind", "note") != filters["kind"]:
        return False
    if "tags" in filters and not set(filters["tags"]) <= set(f.get("tags", ())):
        return False
    when = f.get("event_time") or float(f.get("created_at", 0.0))
    if "since" in filters and when < filters["since"]:
        return False
    if "until" in filters and when > filters["until"]:
        return False
    as_of = filters.get("as_of")
    if as_of is not None and not valid_at(f, as_of):
        return False
    meta = f.get("metadata", {})
    return all(meta.get(k) == v for k, v in filters.get("metadata", {}).items())


def valid_at(fields: dict[str, Any], as_of: float) -> bool:
    """Valid at ``as_of``: holding from its event time (else its creation time) at or before
    it, and not superseded by then (``valid_to``, the successor's event time, after it)."""
    valid_to = fields.get("valid_to")
    event = fields.get("event_time")
    start = float(event) if event is not None else float(fields.get("created_at", 0.0))
    return start <= as_of and (valid_to is None or float(valid_to) > as_of)


def superseded(c: Cand, at: float) -> bool:
    """Whether the candidate was superseded by ``at`` (such notes rank below valid ones)."""
    valid_to = c.fields.get("valid_to")
    return valid_to is not None and float(valid_to) <= at


def score(c: Cand, now: float, half_life_s: float, boost_scale: float) -> None:
    f = c.fields
    c.parts = parts = ranking.score_parts(
        c.relevance,
        float(f.get("importance", 0.5)),
        float(f.get("last_access", 0.0)),
        float(f.get("created_at", 0.0)),
        c.linked.total if c.linked is not None else 0.0,
        now=now,
        half_life_s=half_life_s,
        boost_scale=boost_scale,
    )
    c.score = parts.score


def order(at: float) -> Callable[[Cand], tuple[bool, float, str, str]]:
    """Ranking order: notes still valid at ``at`` first, then by score (ties by namespace, id)."""
    return lambda c: (superseded(c, at), -c.score, c.ns, c.id)


def rank_top(
    cands: list[Cand],
    width: int,
    score: Callable[[Cand], None],
    at: float,
    boost_scale: float,
) -> list[Cand]:
    """The candidates that can be among the best ``width``, scored and in ranking order.

    They are scored from the most relevant down until one's score ceiling (its relevance times
    the largest composite factors) is below the ``width``-th best score of the valid ones
    scored so far: neither it nor any less relevant one can reach that (a superseded note ranks
    below every valid one anyway), so they are left out."""
    best: list[float] = []  # the width best scores of valid candidates, a min-heap
    out = []
    for c in sorted(cands, key=lambda c: -c.relevance):
        if len(best) >= width and ranking.score_ceiling(c.relevance, boost_scale) < best[0]:
            break
        score(c)
        out.append(c)
        if superseded(c, at):
            continue
        if len(best) < width:
            heapq.heappush(best, c.score)
        elif c.score > best[0]:
            heapq.heapreplace(best, c.score)
    out.sort(key=order(at))
    return out


def to_hits(rows: Rows, cands: list[Cand]) -> list[Hit]:
    """The candidates (scored, their hit fields read) as hits. A note returned before under the
    same tag gets a copy of its last hit with this search's numbers (the rest of a hit is its
    note's fields and links, which a new tag would have replaced): a copy costs a quarter of
    building and validating one, and it keeps the fields packed for the first reply that sent
    its original (worker/search/replies.py)."""
    kept = kept_rows(rows, REPLY, cands)
    hits: list[Hit] = []
    for c in cands:
        before = kept.get((c.ns, c.id))
        if before is None:
            hit = to_hit(c)
            rows[c.ns].put(REPLY, c.id, hit)
        else:
            hit = before.model_copy(update=numbers(c))
        hits.append(hit)
    return hits


def numbers(c: Cand) -> dict[str, Any]:
    """The fields of a hit that a search sets: its score and the score's parts, and its hop."""
    p = c.parts
    assert p is not None
    return {
        "score": round(p.score, 6),
        "relevance": round(p.relevance, 6),
        "similarity": round(c.similarity, 6),
        "lexical": round(c.lexical, 6),
        "importance": p.importance,
        "recency": round(p.recency, 6),
        "connection_boost": round(p.connection_boost, 6),
        "hop": c.hop,
    }


def to_hit(c: Cand) -> PackedHit:
    f = c.fields
    return PackedHit(
        id=c.id,
        namespace=c.ns,
        content=f.get("content", ""),
        **numbers(c),
        kind=f.get("kind", "note"),
        keywords=f.get("keywords", []),
        tags=f.get("tags", []),
        links=c.links or {},
        metadata=f.get("metadata", {}),
        agent=f.get("agent"),
        created_at=float(f.get("created_at", 0.0)),
        event_time=f.get("event_time"),
        valid_to=f.get("valid_to"),
        superseded_by=f.get("superseded_by"),
        link_labels=c.linked.labels if c.linked is not None else {},
    )
