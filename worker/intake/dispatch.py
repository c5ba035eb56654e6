"""The dispatcher: watches every shard stream and queues a drain task where work waits.

One runs in each Celery worker's main process. It wakes on new entries (XREAD BLOCK) and,
every ``sweep_interval_s``, sweeps all shards for a backlog that no drain holds (a worker
died, a task was lost), so recovery never depends on Celery's visibility timeout. The
``kicked`` flag keeps several dispatchers from queueing duplicate drains, and new entries
on a shard that a drain holds queue nothing: that drain reads them itself, and looks at the
backlog again after releasing its lease (``drain_shard``). Drains are then queued only when a
shard has no drain, or by a drain that hands its shard over, so a shard keeps its worker (and
that worker's current projection) for as long as the shards outnumber the workers in turn.

On a Redis Cluster the shard streams live in different slots, which one XREAD cannot cover: the
dispatcher then reads each stream's newest entry id every CLUSTER_POLL_S instead (one pipelined
round trip per node) and kicks the shards whose id moved.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from redis import Redis
from redis.exceptions import ResponseError

from producer.connection import data_redis
from producer.core import ENQUEUE_LUA
from producer.keys import Keys
from producer.proposals import REVIEW_LUA
from worker.daemon import Daemon, Step
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)

GROUP = "zq"  #: the consumer group every worker reads shard streams through
IDLE_CONSUMER_S = 3600.0  #: a group member idle this long, holding no entry, is removed
PRUNE_EVERY_S = 300.0  #: how often a dispatcher looks for such members
CLUSTER_POLL_S = 0.05  #: on a Redis Cluster, how often the shard streams' last ids are read

#: KEYS: a shard stream; ARGV: the group, then consumers. Removes each consumer that holds no
#: pending entry, checked in the same atomic step: one that read entries meanwhile keeps them
#: (removing a consumer drops its pending entries, which would then never be redelivered).
PRUNE_LUA = """
local n = 0
for i = 2, #ARGV do
  if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[i]) == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[i])
    n = n + 1
  end
end
return n
"""

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


#: the scripts producers run with EVALSHA: loaded by the workers, so that tenants' Redis users
#: need no SCRIPT LOAD (which would let them run any Lua, a busy loop that stalls everyone too)
PRODUCER_SCRIPTS = (ENQUEUE_LUA, REVIEW_LUA)


def load_scripts(r: Redis) -> int:
    """Load each producer script Redis does not hold (after a restart or a SCRIPT FLUSH);
    return how many were loaded."""
    shas = [hashlib.sha1(script.encode()).hexdigest() for script in PRODUCER_SCRIPTS]
    missing = [
        s for s, held in zip(PRODUCER_SCRIPTS, r.script_exists(*shas), strict=True) if not held
    ]
    for script in missing:
        r.script_load(script)
    return len(missing)


def prune_consumers(r: Redis, keys: Keys, idle_s: float = IDLE_CONSUMER_S) -> int:
    """Remove the members of each shard's consumer group that have been idle ``idle_s`` and
    hold no pending entry: every worker process joins each shard's group under its own name,
    so members of processes long gone would pile up. A live process that is removed (it drained
    nothing for that long) rejoins on its next read. Returns the members removed."""
    removed = 0
    prune = r.register_script(PRUNE_LUA)
    for shard in range(keys.shard_count):
        key = keys.inbox(shard)
        try:
            members = r.xinfo_consumers(key, GROUP)
        except ResponseError:  # no stream or no group yet: nothing joined
            continue
        idle = [m["name"] for m in members if not m["pending"] and m["idle"] > idle_s * 1000]
        if idle:
            removed += int(prune(keys=[key], args=[GROUP, *idle]))
    if removed:
        log.info("removed %d idle consumer-group members", removed)
    return removed


class Dispatcher(Daemon):
    """A daemon thread: wake on new inbox entries, kick their shards, sweep periodically."""

    thread_name = "zq-dispatch"

    def __init__(self, settings: WorkerSettings, send: Callable[[int], None]) -> None:
        super().__init__()
        self.settings = settings
        self.keys = Keys.of(settings)
        self.send = send
        self._streams = {self.keys.inbox(i): "$" for i in range(self.keys.shard_count)}
        self._shard_of = {self.keys.inbox(i): i for i in range(self.keys.shard_count)}
        #: on a cluster: each stream's newest entry id at the last poll (None: not polled since
        #: the start or a failure)
        self._newest: dict[str, bytes | None] | None = None
        self._next_sweep = 0.0
        self._next_prune = 0.0

    @contextmanager
    def session(self) -> Iterator[Step]:
        s = self.settings
        r = data_redis(s, socket_timeout=s.sweep_interval_s + s.socket_timeout_s)
        try:
            yield lambda: self._watch(r)
        finally:
            r.close()

    def _watch(self, r: Redis) -> None:
        """Sweep when due, then wait for new entries (at most one sweep interval) and kick
        their shards. After a failure the next call sweeps first: entries that came in while
        Redis refused are not missed."""
        try:
            if time.monotonic() >= self._next_sweep:
                load_scripts(r)
                sweep(r, self.keys, self.settings.lease_s, self.send)
                self._next_sweep = time.monotonic() + self.settings.sweep_interval_s
            if time.monotonic() >= self._next_prune:
                prune_consumers(r, self.keys)
                self._next_prune = time.monotonic() + PRUNE_EVERY_S
            if self.keys.cluster:
                self._poll(r)
                return
            block_ms = int(self.settings.sweep_interval_s * 1000)
            for stream, entries in r.xread(self._streams, block=block_ms) or []:
                name = stream.decode()
                self._streams[name] = entries[-1][0].decode()
                kick(r, self.keys, self._shard_of[name], self.settings.lease_s, self.send)
        except Exception:
            self._next_sweep = 0.0
            self._newest = None
            raise

    def _poll(self, r: Redis) -> None:
        """The cluster's wait for new entries: each stream's newest id, one round trip per
        node; kick the shards whose id changed since the last poll (after a failure, every
        shard holding entries), then pause."""
        pipe = r.pipeline(transaction=False)
        for stream in self._streams:
            pipe.xrevrange(stream, count=1)
        newest = {
            stream: (got[0][0] if got else None)
            for stream, got in zip(self._streams, pipe.execute(), strict=True)
        }
        before = self._newest or {}
        for stream, last in newest.items():
            if last is not None and last != before.get(stream):
                kick(r, self.keys, self._shard_of[stream], self.settings.lease_s, self.send)
        self._newest = newest
        self._stop.wait(CLUSTER_POLL_S)
