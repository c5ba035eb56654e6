"""Eviction: keep each namespace under ``max_notes`` by tombstoning the lowest-value notes.

survival = importance x (1 + access_count) x recency (as in zettelkasten-memory). Evicted notes
leave the index and their neighbours' links, and each eviction is audited.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from worker.context import WorkerContext
from worker.organise.decay import recency
from worker.store import notes
from worker.store.lease import Lease
from worker.store.tombstone import tombstone_notes

log = logging.getLogger(__name__)

SCAN_CHUNK = 2_000  #: notes read per round trip while scoring


@dataclass(frozen=True)
class Survivor:
    id: str
    importance: float
    access_count: int
    last_access: float
    created_at: float


def survival(n: Survivor, now: float, half_life_s: float) -> float:
    return (
        n.importance * (1 + n.access_count) * recency(now, n.last_access, n.created_at, half_life_s)
    )


def select_evictions(
    notes_: Sequence[Survivor], max_notes: int, now: float, half_life_s: float
) -> list[str]:
    """The ids to evict so that ``max_notes`` remain: lowest survival first, oldest on ties."""
    excess = len(notes_) - max_notes
    if max_notes <= 0 or excess <= 0:
        return []
    ranked = sorted(notes_, key=lambda n: (survival(n, now, half_life_s), n.created_at))
    return [n.id for n in ranked[:excess]]


def evict_namespace(ctx: WorkerContext, ns: str) -> int:
    """Evict what is over the cap in ``ns``, lowest survival first and at most
    ``periodic_max_work`` notes (0 = all; the next run evicts the rest); return how many notes
    were tombstoned."""
    s = ctx.settings
    if s.max_notes <= 0 or ctx.redis.zcard(ctx.keys.active(ns)) <= s.max_notes:
        return 0
    with Lease(ctx.redis, ctx.keys.lock(ns), s.lease_s, owner=ctx.consumer) as lease, lease.kept():
        now = time.time()
        victims = select_evictions(
            _survivors(ctx, ns), s.max_notes, now, s.recency_half_life_days * 86_400
        )
        if s.periodic_max_work:
            victims = victims[: s.periodic_max_work]
        existing = notes.read_notes(ctx.redis, ctx.keys, ns, victims)
        proj = ctx.projection(ns)
        count = tombstone_notes(ctx, proj, lease, existing, "evict", {}, {})
        ctx.redis.hset(ctx.keys.stats(ns), "last_evict", now)
    log.info("evicted ns=%s n=%d", ns, count)
    return count


def _survivors(ctx: WorkerContext, ns: str) -> list[Survivor]:
    ids = [m.decode() for m in ctx.redis.zrange(ctx.keys.active(ns), 0, -1)]
    out: list[Survivor] = []
    for start in range(0, len(ids), SCAN_CHUNK):
        chunk = ids[start : start + SCAN_CHUNK]
        pipe = ctx.redis.pipeline(transaction=False)
        for nid in chunk:
            pipe.hmget(
                ctx.keys.note(ns, nid), ["importance", "access_count", "last_access", "created_at"]
            )
        for nid, (imp, acc, last, created) in zip(chunk, pipe.execute(), strict=True):
            out.append(
                Survivor(
                    nid, float(imp or 0.5), int(acc or 0), float(last or 0.0), float(created or 0.0)
                )
            )
    return out
