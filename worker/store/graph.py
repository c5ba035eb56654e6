"""Read a namespace's link graph from Redis for the periodic organisation jobs (importance,
consolidation): every active note's chosen fields and its links, in chunked round trips."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from producer.protocol import link_weight, unpack_link
from worker.context import WorkerContext

READ_CHUNK = 2_000  #: notes read per round trip


@dataclass
class Graph:
    """Active notes in seq order, each with the requested fields (None when absent) and its
    links (neighbour -> weight; only links to other active notes)."""

    ids: list[str] = field(default_factory=list)
    fields: dict[str, dict[str, bytes | None]] = field(default_factory=dict)
    links: dict[str, dict[str, float]] = field(default_factory=dict)
    #: neighbour -> the link's reason, per note (read only when asked for)
    reasons: dict[str, dict[str, str]] = field(default_factory=dict)


def read_graph(
    ctx: WorkerContext, ns: str, names: Sequence[str], *, reasons: bool = False
) -> Graph:
    """The active notes of ``ns`` with the fields ``names``, their links and, if asked, the
    links' reasons."""
    graph = Graph(ids=[m.decode() for m in ctx.redis.zrange(ctx.keys.active(ns), 0, -1)])
    for start in range(0, len(graph.ids), READ_CHUNK):
        chunk = graph.ids[start : start + READ_CHUNK]
        pipe = ctx.redis.pipeline(transaction=False)
        for nid in chunk:
            pipe.hmget(ctx.keys.note(ns, nid), list(names))
            pipe.hgetall(ctx.keys.links(ns, nid))
        rows = iter(pipe.execute())
        for nid in chunk:
            graph.fields[nid] = dict(zip(names, next(rows), strict=True))
            packed = next(rows)
            graph.links[nid] = {m.decode(): link_weight(raw) for m, raw in packed.items()}
            if reasons:
                graph.reasons[nid] = {m.decode(): link_reason(raw) for m, raw in packed.items()}
    active = set(graph.ids)
    for nid, nbs in graph.links.items():
        graph.links[nid] = {nb: w for nb, w in nbs.items() if nb in active and nb != nid}
    return graph


def link_reason(raw: bytes) -> str:
    """The reason of a packed link ("" when it has none)."""
    return str(unpack_link(raw)[1].get("reason", ""))
