"""The degree cap (``max_degree``): no note keeps more links than that, so hub notes stay
bounded. Before links are committed, ``plan_cap`` reads the link counts of the notes they
touch (one script) and, for the notes that would go over the cap, their links with their
metadata (one pipeline); ``cap_degree`` decides which links go (the weakest, from both
sides); ``apply_cap`` removes the existing ones in the caller's MULTI/EXEC with one ``unlink``
audit entry each. Callers hold the namespace lock, so what was read is still true when they
commit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.client import Pipeline

from producer.protocol import link_meta, link_weights
from worker import bulk
from worker.context import WorkerContext
from worker.store import notes
from worker.store.notes import Link

DEGREE_CAP = "degree-cap"  #: audit source of a link dropped by the cap
#: The link count of each key: one command for the thousands of notes a batch touches.
DEGREES_LUA = """
local out = {}
for i, key in ipairs(KEYS) do
    out[i] = redis.call('HLEN', key)
end
return out
"""


@dataclass
class Capped:
    """The links to write and the existing links (a, b, weight) the cap drops, with metas."""

    links: list[Link]
    dropped: list[tuple[str, str, float]] = field(default_factory=list)
    metas: list[dict[str, Any]] = field(default_factory=list)
    refused: int = 0  #: proposed links not written because of the cap


def plan_cap(
    ctx: WorkerContext,
    ns: str,
    links: Sequence[Link],
    removed: Collection[tuple[str, str]] = (),
) -> Capped:
    """Which of ``links`` to write and which existing links to drop; ``removed`` holds the
    links (a, b) the same commit removes anyway."""
    cap = ctx.settings.max_degree
    if cap <= 0 or not links:
        return Capped(list(links))
    ends = sorted({end for link in links for end in (link.a, link.b)})
    delta = dict.fromkeys(ends, 0)
    for link in links:
        delta[link.a] += 1
        delta[link.b] += 1
    for a, b in removed:
        for end in (a, b):
            if end in delta:
                delta[end] -= 1
    pipe = bulk.BulkPipeline(ctx.redis)
    pipe.queue("EVAL", DEGREES_LUA, len(ends), *[ctx.keys.links(ns, nid) for nid in ends])
    counts = pipe.execute()[0]
    crowded = [nid for nid, count in zip(ends, counts, strict=True) if count + delta[nid] > cap]
    existing, metas = _crowded(ctx, ns, crowded) if crowded else ({}, {})
    for a, b in removed:
        existing.get(a, {}).pop(b, None)
        existing.get(b, {}).pop(a, None)
    kept, dropped = cap_degree(existing, links, cap)
    return Capped(
        kept, dropped, [_meta(metas, a, b) for a, b, _ in dropped], len(links) - len(kept)
    )


def _crowded(
    ctx: WorkerContext, ns: str, ids: list[str]
) -> tuple[dict[str, dict[str, float]], dict[str, dict[bytes, bytes]]]:
    """The links of each crowded note as neighbour -> weight and as the packed links (for the
    metadata of those the cap drops), in one round trip."""
    pipe = bulk.BulkPipeline(ctx.redis)
    for nid in ids:
        pipe.queue("HGETALL", ctx.keys.links(ns, nid))
    rows = [bulk.fields(row) for row in pipe.execute()]
    return (
        {nid: link_weights(row) for nid, row in zip(ids, rows, strict=True)},
        dict(zip(ids, rows, strict=True)),
    )


def _meta(metas: dict[str, dict[bytes, bytes]], a: str, b: str) -> dict[str, Any]:
    """The metadata of link a - b, from whichever end read it."""
    raw = metas.get(a, {}).get(b.encode()) or metas.get(b, {}).get(a.encode())
    return link_meta(raw)


def apply_cap(pipe: Pipeline, ctx: WorkerContext, ns: str, capped: Capped, actor: str) -> None:
    """Drop the planned links from both sides, audit each, and count them (inside MULTI)."""
    if not capped.dropped and not capped.refused:
        return
    notes.unlink_pairs(pipe, ctx.keys, ns, [(a, b) for a, b, _ in capped.dropped])
    for (a, b, weight), meta in zip(capped.dropped, capped.metas, strict=True):
        notes.audit(
            pipe,
            ctx.keys,
            ns,
            "unlink",
            a,
            actor=actor,
            source=DEGREE_CAP,
            before={"links": {b: [weight, meta.get("reason", ""), meta.get("label", "")]}},
            after={"links": {}, "max_degree": ctx.settings.max_degree},
        )
    stats = ctx.keys.stats(ns)
    pipe.hincrby(stats, "links", -len(capped.dropped))
    pipe.hincrby(stats, "links_capped", len(capped.dropped) + capped.refused)


def cap_degree(
    existing: Mapping[str, Mapping[str, float]], new: Sequence[Link], max_degree: int
) -> tuple[list[Link], list[tuple[str, str, float]]]:
    """Keep every note at most ``max_degree`` links (0 = no cap) once ``new`` is added.

    ``existing`` holds the current links (neighbour -> weight) of every note a new link
    touches. While a note is over the cap its weakest link (ties: the smaller neighbour id) is
    dropped, from both sides. Returns the new links that survive and the existing links
    (a, b, weight) to drop."""
    if max_degree <= 0:
        return list(new), []
    # Only a note with existing links, or with more new ones than the cap, can be over it.
    gained = Counter(end for link in new for end in (link.a, link.b))
    over = set(existing) | {nid for nid, n in gained.items() if n > max_degree}
    adj = {nid: dict(existing.get(nid, {})) for nid in over}
    for link in new:
        if link.a in adj:
            adj[link.a][link.b] = link.weight
        if link.b in adj:
            adj[link.b][link.a] = link.weight
    dropped: set[tuple[str, str]] = set()
    # Dropping only shrinks notes: those under the cap now stay under it.
    for nid in sorted(nid for nid, nbs in adj.items() if len(nbs) > max_degree):
        nbs = adj[nid]
        while len(nbs) > max_degree:
            weakest = min(nbs, key=lambda nb: (nbs[nb], nb))
            del nbs[weakest]
            adj.get(weakest, {}).pop(nid, None)
            dropped.add((nid, weakest) if nid < weakest else (weakest, nid))
    if not dropped:
        return list(new), []
    kept = [link for link in new if _pair(link) not in dropped]
    gone = [(a, b, existing[a][b]) for a, b in sorted(dropped) if b in existing.get(a, {})]
    gone += [(a, b, existing[b][a]) for a, b in sorted(dropped) if a in existing.get(b, {})]
    return kept, list({(a, b): (a, b, w) for a, b, w in gone}.values())


def _pair(link: Link) -> tuple[str, str]:
    return (link.a, link.b) if link.a < link.b else (link.b, link.a)
