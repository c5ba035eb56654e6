"""Consistency check of one namespace's canonical data (used by tests, the load bench and
``zettelq check``). Returns human-readable problems; an empty list means consistent. It reads
without a lock, so writes in flight can show up as passing problems: check a quiet namespace,
or check again."""

from __future__ import annotations

from producer.protocol import unpack_link
from worker.context import WorkerContext

READ_CHUNK = 2_000  #: notes read per round trip


def check_namespace(ctx: WorkerContext, ns: str) -> list[str]:
    """Every active note has a hash, a vector and a unique seq; every link has both ends active,
    the same weight both ways and its reason; tombstoned notes have no links; the stats
    counter of links (``stats().links``) is the number of links stored."""
    r, keys = ctx.redis, ctx.keys
    active = {m.decode(): int(s) for m, s in r.zrange(keys.active(ns), 0, -1, withscores=True)}
    tombstoned = {m.decode() for m in r.zrange(keys.tombstoned(ns), 0, -1)}
    problems = [f"note {n} is both active and tombstoned" for n in active.keys() & tombstoned]
    if len(set(active.values())) != len(active):
        problems.append("two active notes share a seq")
    ids = list(active)
    links: dict[str, dict[str, float]] = {}
    for start in range(0, len(ids), READ_CHUNK):
        chunk = ids[start : start + READ_CHUNK]
        pipe = r.pipeline(transaction=False)
        for nid in chunk:
            pipe.hmget(keys.note(ns, nid), ["status", "seq", "vec"])
            pipe.hgetall(keys.links(ns, nid))
        replies = iter(pipe.execute())
        for nid in chunk:
            (status, seq, vec), packed = next(replies), next(replies)
            if status != b"active" or seq is None or int(seq) != active[nid] or not vec:
                problems.append(f"note {nid}: hash does not match the active set")
            stored = {m.decode(): unpack_link(raw) for m, raw in packed.items()}
            links[nid] = {m: weight for m, (weight, _) in stored.items()}
            if any("reason" not in meta for _, meta in stored.values()):
                problems.append(f"note {nid}: a link without its reason")
    problems += _check_links(links)
    problems += _check_count(int(r.hget(keys.stats(ns), "links") or 0), links)
    problems += [f"tombstoned {n} keeps links" for n in tombstoned if r.exists(keys.links(ns, n))]
    return problems


def _check_links(links: dict[str, dict[str, float]]) -> list[str]:
    problems = []
    for nid, nbs in links.items():
        for nb, weight in nbs.items():
            if nb == nid:
                problems.append(f"note {nid} links to itself")
            elif nb not in links:
                problems.append(f"link {nid} -> {nb}: {nb} is not an active note")
            elif links[nb].get(nid) != weight:
                problems.append(f"link {nid} -> {nb} is one-sided or weighted differently")
    return problems


def _check_count(counted: int, links: dict[str, dict[str, float]]) -> list[str]:
    """The stats counter against the links stored (each link once, from either side)."""
    stored = len({(a, b) if a < b else (b, a) for a, nbs in links.items() for b in nbs})
    if counted == stored:
        return []
    return [f"stats count {counted} links, {stored} are stored"]
