"""The dispatcher: watches every shard stream and queues a drain task where work waits.

One runs in each Celery worker's main process. It wakes on new entries (XREAD BLOCK) and,
every ``sweep_interval_s``, sweeps all shards for a backlog that no drain holds (a worker
died, a task was lost), so recovery never depends on Celery's visibility timeout. The
``kicked`` flag keeps several dispatchers from queueing duplicate drains, and new entries
on a shard that a drain holds queue nothing: that drain reads them itself, and looks at the
backlog again after releasing its lease (``drain_shard``). Drains are then queued only when a
shard has no drain, or by a drain that hands its shard over, so a shard keeps its worker (and
that worker's current projection) for as long as the shards outnumber the workers in turn.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from producer.core import redis_kwargs
from producer.keys import Keys
from worker.daemon import Daemon
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)


#: KEYS: the shard's kick flag, its lease; ARGV: the flag's TTL in ms. Sets the flag (NX)
#: unless a drain holds the shard; 1 when it was set.
KICK_LUA = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if redis.call('SET', KEYS[1], 1, 'NX', 'PX', ARGV[1]) then return 1 end
return 0
"""


def kick(r: Redis, keys: Keys, shard: int, ttl_s: float, send: Callable[[int], None]) -> bool:
    """Queue a drain of ``shard`` unless one is queued already or a drain holds the shard;
    True when one was queued."""
    flag = r.register_script(KICK_LUA)(
        keys=[keys.kicked(shard), keys.lease(shard)], args=[int(ttl_s * 1000)]
    )
    if not flag:
        return False
    send(shard)
    return True


def sweep(r: Redis, keys: Keys, ttl_s: float, send: Callable[[int], None]) -> list[int]:
    """Kick every shard that has a backlog and no live drain; return the shards kicked."""
    pipe = r.pipeline(transaction=False)
    for shard in range(keys.shard_count):
        pipe.xlen(keys.inbox(shard))
    backlogs = pipe.execute()
    return [
        shard
        for shard, backlog in enumerate(backlogs)
        if backlog and kick(r, keys, shard, ttl_s, send)
    ]


class Dispatcher(Daemon):
    """A daemon thread: wake on new inbox entries, kick their shards, sweep periodically."""

    thread_name = "zq-dispatch"

    def __init__(self, settings: WorkerSettings, send: Callable[[int], None]) -> None:
        super().__init__()
        self.settings = settings
        self.keys = Keys(settings.key_prefix, settings.shard_count)
        self.send = send

    def _run(self) -> None:
        s = self.settings
        block_ms = int(s.sweep_interval_s * 1000)
        r = Redis.from_url(
            s.redis_url,
            socket_timeout=s.sweep_interval_s + s.socket_timeout_s,
            **redis_kwargs(s),
        )
        backoff = 0.1
        while not self._stop.is_set():
            try:
                self._watch(r, block_ms)
                backoff = 0.1
            except (RedisConnectionError, RedisTimeoutError) as exc:
                log.warning("dispatcher lost Redis (%s); retrying in %.1fs", exc, backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
        r.close()

    def _watch(self, r: Redis, block_ms: int) -> None:
        streams = {self.keys.inbox(i): "$" for i in range(self.keys.shard_count)}
        shard_of = {self.keys.inbox(i): i for i in range(self.keys.shard_count)}
        next_sweep = 0.0
        while not self._stop.is_set():
            if time.monotonic() >= next_sweep:
                sweep(r, self.keys, self.settings.lease_s, self.send)
                next_sweep = time.monotonic() + self.settings.sweep_interval_s
            for stream, entries in r.xread(streams, block=block_ms) or []:
                name = stream.decode()
                streams[name] = entries[-1][0].decode()
                kick(r, self.keys, shard_of[name], self.settings.lease_s, self.send)
