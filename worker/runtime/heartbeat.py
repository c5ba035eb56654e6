"""Process heartbeats: every worker, searcher and beat process says that it is alive, so that
`zettelq health` and the container healthchecks can tell without `celery inspect` (a broker round
trip to every worker, answered only by Celery workers and only when their main loop is free).

Each process renews a hash ``P:process:<consumer>`` (role, host, pid, started, beat, state,
version) every HEARTBEAT_S with a TTL of LIVE_S, and lists itself in ``P:processes`` (consumer ->
when its hash expires, epoch ms), so a reader finds the live processes without a SCAN over every
key. A clean stop deletes both at once; a killed process's hash lapses after LIVE_S and its
index entry is pruned by a later beat of any process. The hash's TTL, kept by Redis, is what says
alive: the index's times only decide when an entry is pruned, so clocks need not agree.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable
from contextlib import suppress
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version

from redis import Redis
from redis.exceptions import RedisError

from producer.connection import data_redis
from producer.keys import Keys
from producer.settings import ProducerSettings
from worker import daemon
from worker.connection import new_consumer
from worker.daemon import Daemon

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0  #: how often a process renews its heartbeat
LIVE_S = 5.0  #: the heartbeat's TTL: a process silent this long counts as gone
PRUNE_AFTER_S = 60.0  #: index entries whose hash lapsed this long ago are dropped
ROLES = ("worker", "searcher", "beat")  #: the kinds of process that beat


def zettelq_version() -> str:
    """The installed zettelq's version ("unknown" when run from a tree that is not installed)."""
    try:
        return version("zettelq")
    except PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class Process:
    """One process's heartbeat: times are epoch seconds, ``beat`` the last renewal."""

    consumer: str
    role: str
    host: str
    pid: int
    started: float
    beat: float
    state: str
    version: str
    errors: str = ""  #: errors its threads survived, ``Kind=count,...`` (worker.daemon)

    def fields(self) -> dict[str, str]:
        """The hash fields (every value a string; the consumer is in the key)."""
        return {k: str(v) for k, v in asdict(self).items() if k != "consumer"}

    @classmethod
    def from_fields(cls, consumer: str, raw: dict[bytes, bytes]) -> Process:
        f = {k.decode(): v.decode() for k, v in raw.items()}
        return cls(
            consumer=consumer,
            role=f.get("role", "?"),
            host=f.get("host", "?"),
            pid=int(f.get("pid", "0")),
            started=float(f.get("started", "0")),
            beat=float(f.get("beat", "0")),
            state=f.get("state", "?"),
            version=f.get("version", "?"),
            errors=f.get("errors", ""),
        )


def _counts(counts: Counter[str]) -> str:
    return ",".join(f"{kind}={n}" for kind, n in sorted(counts.items()))


def beat_once(r: Redis, keys: Keys, proc: Process) -> None:
    """Write ``proc``'s heartbeat (TTL LIVE_S), index it and prune lapsed index entries."""
    key, ttl_ms = keys.process(proc.consumer), int(LIVE_S * 1000)
    now_ms = int(time.time() * 1000)
    pipe = r.pipeline(transaction=False)
    pipe.hset(key, mapping=proc.fields())
    pipe.pexpire(key, ttl_ms)
    pipe.zadd(keys.processes(), {proc.consumer: now_ms + ttl_ms})
    pipe.zremrangebyscore(keys.processes(), "-inf", now_ms - int(PRUNE_AFTER_S * 1000))
    pipe.execute()


def forget(r: Redis, keys: Keys, consumer: str) -> None:
    """Delete a process's heartbeat and its index entry (a clean stop)."""
    pipe = r.pipeline(transaction=False)
    pipe.delete(keys.process(consumer))
    pipe.zrem(keys.processes(), consumer)
    pipe.execute()


def live_processes(r: Redis, keys: Keys) -> list[Process]:
    """Every process whose heartbeat has not lapsed, by role, host and start time."""
    consumers = [c.decode() for c in r.zrange(keys.processes(), 0, -1)]
    pipe = r.pipeline(transaction=False)
    for consumer in consumers:
        pipe.hgetall(keys.process(consumer))
    found = zip(consumers, pipe.execute(), strict=True)
    live = [Process.from_fields(c, raw) for c, raw in found if raw]
    return sorted(live, key=lambda p: (p.role, p.host, p.started))


def running() -> str:
    """The state of a worker or searcher process: it runs while it beats."""
    return "running"


class ProcessHeartbeat(Daemon):
    """A daemon thread that renews this process's heartbeat every HEARTBEAT_S until ``stop()``,
    which deletes it. ``state`` is asked on every beat (a beat: leader or standby)."""

    thread_name = "zq-heartbeat"
    interval_s = HEARTBEAT_S

    def __init__(
        self,
        settings: ProducerSettings,
        role: str,
        *,
        consumer: str | None = None,
        state: Callable[[], str] = running,
    ) -> None:
        super().__init__()
        self.keys = Keys.of(settings)
        self.redis = data_redis(settings, socket_timeout=settings.socket_timeout_s)
        self.consumer = consumer or new_consumer()
        self.role, self.state = role, state
        self.started, self.version = time.time(), zettelq_version()

    def process(self) -> Process:
        """This process's heartbeat as of now: state ``failing: <what>`` while a thread of the
        process died or fails for long (worker.daemon.problems), which `zettelq health` counts
        as unhealthy, so a healthcheck restarts a process that does not heal by itself."""
        problems = daemon.problems()
        return Process(
            consumer=self.consumer,
            role=self.role,
            host=socket.gethostname(),
            pid=os.getpid(),
            started=self.started,
            beat=time.time(),
            state="failing: " + "; ".join(problems) if problems else self.state(),
            version=self.version,
            errors=_counts(daemon.error_counts()),
        )

    def stop(self, timeout_s: float = 5.0) -> None:
        super().stop(timeout_s)
        with suppress(RedisError):
            forget(self.redis, self.keys, self.consumer)
        self.redis.close()

    def step(self) -> None:
        beat_once(self.redis, self.keys, self.process())
