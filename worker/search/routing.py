"""Search affinity: which search lists a worker process's search threads serve.

A producer queues a search over one namespace on its shard's list (``P:{sN}:search``) and one
over several namespaces on the shared list (``P:search``). A search thread serves:

- the shards its process drains (the shard's ``drainer`` key names the process): its
  projections of their namespaces are current, so no other process has to open them or catch
  them up on every note the drainer organises;
- the shards whose drainer serves no searches or has gone (no live ``P:searcher:<consumer>``
  key: a search server renews its own every HEARTBEAT_S and deletes it when it stops), and
  those nobody has drained yet;
- the shards whose list holds HELP_AT or more searches (their drainer falls behind, so others
  help: a hot namespace is not served by one process alone);
- the shared list.

Each thread re-reads that every REFRESH_S and turns the order of its lists at every wait, so a
busy list does not starve the others. When a drainer dies, its shards' searches wait at most
LIVE_S + REFRESH_S before other processes take them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import suppress

from redis import Redis
from redis.exceptions import RedisError

from worker.context import WorkerContext
from worker.daemon import Daemon

REFRESH_S = 0.5  #: how often a search thread re-reads which lists it serves
HEARTBEAT_S = 0.5  #: how often a search server renews its searcher key
LIVE_S = 3.0  #: the searcher key's TTL: a process silent this long counts as gone
PRUNE_AFTER_MS = 60_000  #: index entries of search servers whose stats lapsed this long ago go
HELP_AT = 4  #: searches waiting on a shard's list from which every search thread serves it


class Routes:
    """The lists one search thread waits on, refreshed every REFRESH_S."""

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self._lists = [ctx.keys.search_queue()]
        self._due = 0.0
        self._turn = 0

    def lists(self, conn: Redis) -> list[str]:
        """The lists to wait on now, starting one further along than last time."""
        now = time.monotonic()
        if now >= self._due:
            self._lists = served(self.ctx, conn)
            self._due = now + REFRESH_S
        self._turn = (self._turn + 1) % len(self._lists)
        return self._lists[self._turn :] + self._lists[: self._turn]


def served(ctx: WorkerContext, conn: Redis) -> list[str]:
    """The shard lists this process serves (see the module docstring), then the shared list."""
    keys, me = ctx.keys, ctx.consumer
    shards = range(keys.shard_count)
    pipe = conn.pipeline(transaction=False)
    for shard in shards:
        pipe.get(keys.drainer(shard))
    for shard in shards:
        pipe.llen(keys.shard_search(shard))
    replies = pipe.execute()
    drainers = [raw.decode() if raw else None for raw in replies[: len(shards)]]
    waiting = replies[len(shards) :]
    others = sorted({d for d in drainers if d is not None and d != me})
    live = {me}
    if others:
        pipe = conn.pipeline(transaction=False)
        for other in others:
            pipe.exists(keys.searcher(other))
        live |= {other for other, up in zip(others, pipe.execute(), strict=True) if up}
    return [
        keys.shard_search(shard)
        for shard, drainer, queued in zip(shards, drainers, waiting, strict=True)
        if drainer == me or drainer not in live or queued >= HELP_AT
    ] + [keys.search_queue()]


class Heartbeat(Daemon):
    """A daemon thread that keeps this process's searcher key alive while ``healthy()`` says
    its search threads are, until ``stop()``, which deletes it: either way other processes
    serve its shards from their next refresh on. While Redis is away the key lapses."""

    thread_name = "zq-search-beat"
    interval_s = HEARTBEAT_S

    def __init__(
        self,
        ctx: WorkerContext,
        healthy: Callable[[], bool],
        stats: Callable[[], Mapping[str, float]],
    ) -> None:
        super().__init__()
        self.ctx, self.healthy, self.stats = ctx, healthy, stats

    def stop(self, timeout_s: float = 5.0) -> None:
        super().stop(timeout_s)
        keys, me = self.ctx.keys, self.ctx.consumer
        with suppress(RedisError):
            pipe = self.ctx.redis.pipeline(transaction=False)
            pipe.delete(keys.searcher(me))
            pipe.delete(keys.search_stats(me))
            pipe.zrem(keys.searchers(), me)
            pipe.execute()

    def step(self) -> None:
        keys, me = self.ctx.keys, self.ctx.consumer
        if not self.healthy():
            self.ctx.redis.delete(keys.searcher(me))
            return
        ttl_ms, now_ms = int(LIVE_S * 1000), int(time.time() * 1000)
        pipe = self.ctx.redis.pipeline(transaction=False)
        pipe.set(keys.searcher(me), 1, px=ttl_ms)
        pipe.hset(keys.search_stats(me), mapping=dict(self.stats()))
        pipe.pexpire(keys.search_stats(me), ttl_ms)
        pipe.zadd(keys.searchers(), {me: now_ms + ttl_ms})
        pipe.zremrangebyscore(keys.searchers(), "-inf", now_ms - PRUNE_AFTER_MS)
        pipe.execute()
