"""Periodic FAISS snapshots so a restarted worker loads its index and only catches up.

Every process that holds projections (worker pool processes, searchers) saves its own from a
``Snapshotter`` thread every ``snapshot_every_s``. Incremental: a namespace is saved again only
once its change log moved past the position this process last saved it at; bounded by
``periodic_max_namespaces`` per run (namespaces this process never saved first). The run is
recorded like the periodic jobs' (``Keys.runs``).
"""

from __future__ import annotations

import logging
import time
from functools import partial

from redis.exceptions import RedisError

from worker.context import WorkerContext
from worker.daemon import Daemon
from worker.index.projection import catch_up, freeze, write_snapshot
from worker.organise.periodic import PeriodicRun, record_run

log = logging.getLogger(__name__)


def snapshot_all(ctx: WorkerContext) -> int:
    """Catch up and save this process's projections of the namespaces changed since it last
    saved them; return how many were saved."""
    at, started = time.time(), time.perf_counter()
    held = ctx.held_projections()
    due = _due(ctx, list(held))
    picked = due[: ctx.settings.periodic_max_namespaces]
    for ns in picked:
        proj = held[ns]
        with proj.lock:
            catch_up(ctx, proj)
        # the lock is held for moments only: ingest and searches go on while it is copied
        # and written; caught up again as the copy is finished
        frozen = freeze(ctx, proj, partial(catch_up, ctx, proj))
        write_snapshot(ctx, frozen)
        ctx.snapshots[ns] = frozen.side["position"]
        stats = {"index_kind": frozen.index.kind, "index_size": len(frozen.index)}
        ctx.redis.hset(ctx.keys.stats(ns), mapping={**stats, "last_snapshot": time.time()})
        frozen.release()
    seconds = time.perf_counter() - started
    left = len(due) - len(picked)
    run = PeriodicRun(
        job="snapshot", at=at, seconds=seconds, namespaces=len(picked), left=left, work=len(picked)
    )
    record_run(ctx, run)
    return len(picked)


def _due(ctx: WorkerContext, held: list[str]) -> list[str]:
    """Of the namespaces ``held`` (this process has their projections), those whose change log
    moved since this process saved them, never-saved first. A namespace it does not hold is not
    opened: a snapshot is a restart cache for the processes that serve the namespace, and
    opening every namespace would make the process that runs this task hold them all."""
    names = sorted(held)
    pipe = ctx.redis.pipeline(transaction=False)
    for ns in names:
        pipe.xrevrange(ctx.keys.changes(ns), count=1)
    tails = [t[0][0].decode() if t else "0-0" for t in pipe.execute()]
    due = [ns for ns, tail in zip(names, tails, strict=True) if ctx.snapshots.get(ns) != tail]
    return sorted(due, key=lambda ns: (ns in ctx.snapshots, ns))


class Snapshotter(Daemon):
    """A daemon thread that runs ``snapshot_all`` for this process every ``snapshot_every_s``
    until ``stop()``, which runs it once more: a process that stops cleanly leaves snapshots at
    its last position, so its restart only catches up on what came after (and a process younger
    than ``snapshot_every_s`` does not rebuild from Redis). A run that fails (Redis away, disk
    full) is retried (worker.daemon); the last one is logged and the process still stops."""

    thread_name = "zq-snapshot"
    wait_first = True

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__()
        self.ctx = ctx
        self.interval_s = ctx.settings.snapshot_every_s

    def step(self) -> int:
        return snapshot_all(self.ctx)

    def stop(self, timeout_s: float = 5.0) -> None:
        super().stop(timeout_s)
        try:  # a run with nothing to save is not recorded: the last productive one stays shown
            saved = (
                snapshot_all(self.ctx) if _due(self.ctx, list(self.ctx.held_projections())) else 0
            )
        except (RedisError, OSError) as exc:
            log.warning("no snapshot as this process stops: %s", exc)
            return
        if saved:
            log.info("saved %d snapshot(s) as this process stops", saved)
