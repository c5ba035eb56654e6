"""Read your writes: a search or flush waits until every job queued to its namespaces' shards
before it was taken is committed, draining a shard inline when no worker holds it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from worker.bulk import BulkPipeline
from worker.context import WorkerContext
from worker.errors import NotFresh, SlotMoving
from worker.index.changelog import stream_pos
from worker.intake.drain import drain_shard


def wait_fresh(ctx: WorkerContext, namespaces: list[str], deadline: float) -> None:
    """Block until every job queued to these namespaces' shards by now is committed."""
    pipe = BulkPipeline(ctx.redis)
    wait = queue_inbox_reads(pipe, ctx, namespaces)
    wait(pipe.execute(), deadline)


def queue_inbox_reads(
    pipe: BulkPipeline, ctx: WorkerContext, namespaces: list[str]
) -> Callable[[list[Any], float], bool]:
    """Queue the read of the last entry of each of these namespaces' shard streams; the
    returned function waits, from the pipeline's replies, until each shard has committed up to
    that entry, and tells whether any had anything left to commit.

    Committed entries are deleted from the stream, so a shard is fresh once its first
    remaining entry is newer than the last entry present when the search was taken."""
    shards = sorted({ctx.keys.shard_of(ns) for ns in namespaces})
    start = len(pipe)
    for shard in shards:
        pipe.xrevrange(ctx.keys.inbox(shard), count=1)

    def wait(replies: list[Any], deadline: float) -> bool:
        waited = False
        for shard, last in zip(shards, replies[start : start + len(shards)], strict=True):
            if last:
                waited |= _wait_shard(ctx, shard, stream_pos(last[0][0]), deadline)
        return waited

    return wait


def _wait_shard(ctx: WorkerContext, shard: int, target: tuple[int, int], deadline: float) -> bool:
    """Wait for the shard to commit up to ``target``; whether it had anything left to commit."""
    delay = 0.001
    waited = False
    while True:
        first = ctx.redis.xrange(ctx.keys.inbox(shard), count=1)
        if not first or stream_pos(first[0][0]) > target:
            return waited
        waited = True
        if time.time() > deadline:
            raise NotFresh(f"shard {shard} not organised before the search deadline")
        try:
            processed = drain_shard(ctx, shard, wait_ms=0).processed
        except SlotMoving:  # a resharding moved the slot under the commit: the next pass commits
            processed = 0  # where it went (the entries stay pending until then)
        if processed == 0:
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
