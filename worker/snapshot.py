"""Periodic FAISS snapshots so a restarted worker loads its index and only catches up."""

from __future__ import annotations

import logging
import time

from worker.context import WorkerContext
from worker.projection import catch_up, save_snapshot

log = logging.getLogger(__name__)


def snapshot_all(ctx: WorkerContext) -> int:
    """Catch up and save the projection of every namespace; return how many were saved."""
    names = sorted(m.decode() for m in ctx.redis.smembers(ctx.keys.namespaces()))
    for ns in names:
        proj = ctx.projection(ns)
        with proj.lock:
            catch_up(ctx, proj)
            save_snapshot(ctx, proj)
            size, kind = len(proj.index), proj.index.kind
        ctx.redis.hset(
            ctx.keys.stats(ns),
            mapping={"index_kind": kind, "index_size": size, "last_snapshot": time.time()},
        )
    log.info("snapshot namespaces=%d", len(names))
    return len(names)
