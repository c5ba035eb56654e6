"""Search serving: threads that BRPOP search jobs and LPUSH replies (no Celery hop).

Every worker process runs ``search_threads`` of them against its own projections. They wait on
the lists of the shards their process drains, of the shards no live search server drains, of
shards with a backlog, and on the shared list (worker/routing.py): a namespace's searches go to
the process whose projections of it are current, and adding workers adds search capacity.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Self

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from producer.core import redis_kwargs
from producer.errors import ProtocolError
from producer.protocol import Reply, SearchJob, pack, unpack
from worker import search
from worker.bulk import BulkPipeline
from worker.context import WorkerContext
from worker.routing import REFRESH_S, Heartbeat, Routes
from worker.signing import SignatureRejected, check_signature

log = logging.getLogger(__name__)

POLL_S = 1.0  #: BRPOP timeout, so that stop() is noticed within a second


def serve_once(ctx: WorkerContext, conn: Redis, lists: list[str], timeout_s: float) -> bool:
    """Take one search job from ``lists`` (waiting up to ``timeout_s``) and reply; False when
    none came."""
    got = conn.brpop(lists, timeout=timeout_s)
    if got is None:
        return False
    try:
        job = unpack(SearchJob, got[1])
    except ProtocolError as exc:
        log.warning("dropped undecodable search job: %s", exc)
        return True
    try:
        check_signature(ctx.settings, got[1], job.namespaces)
        reply = search.handle(ctx, job)
    except SignatureRejected as exc:
        log.warning("refused %s job_id=%s: %s", job.kind, job.job_id, exc)
        reply = Reply(job_id=job.job_id, ok=False, error=f"refused: {exc}")
    except (RedisConnectionError, RedisTimeoutError):
        raise
    except Exception as exc:
        log.exception("search job_id=%s failed", job.job_id)
        reply = Reply(job_id=job.job_id, ok=False, error=f"worker error: {exc!r}")
    if reply is not None:
        pipe = BulkPipeline(ctx.redis)
        pipe.lpush(ctx.keys.reply(job.job_id), pack(reply))
        pipe.expire(ctx.keys.reply(job.job_id), ctx.settings.result_ttl_s)
        if job.reinforce:
            search.touch(pipe, ctx.keys, reply.hits, time.time())
        pipe.execute()
    return True


class JobServer:
    """``threads`` daemon threads, each calling what ``server`` returns over its own Redis
    connection until ``stop()``; subclasses say what one call serves."""

    name = "jobs"  #: thread names are zq-<name>-<i>

    def __init__(self, ctx: WorkerContext, threads: int = 1) -> None:
        self.ctx = ctx
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, name=f"zq-{self.name}-{i}", daemon=True)
            for i in range(threads)
        ]

    def start(self) -> Self:
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout_s)

    def _run(self) -> None:
        s = self.ctx.settings
        conn = Redis.from_url(
            s.redis_url,
            socket_timeout=POLL_S + s.socket_timeout_s,
            **redis_kwargs(s),
        )
        serve, backoff = self.server(conn), 0.1
        while not self._stop.is_set():
            try:
                serve()
                backoff = 0.1
            except (RedisConnectionError, RedisTimeoutError) as exc:
                log.warning("%s server lost Redis (%s); retrying in %.1fs", self.name, exc, backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
        conn.close()

    def server(self, conn: Redis) -> Callable[[], bool]:
        """What one thread calls in its loop: serve one job (or wait for one) over ``conn``."""
        raise NotImplementedError


class SearchServer(JobServer):
    """Search threads, and the heartbeat that tells other processes this one serves the
    searches of the shards it drains (worker/routing.py)."""

    name = "search"

    def __init__(self, ctx: WorkerContext, threads: int = 1) -> None:
        super().__init__(ctx, threads)
        self._heartbeat = Heartbeat(ctx)

    def start(self) -> Self:
        self._heartbeat.start()
        return super().start()

    def stop(self, timeout_s: float = 5.0) -> None:
        super().stop(timeout_s)
        self._heartbeat.stop(timeout_s)

    def server(self, conn: Redis) -> Callable[[], bool]:
        routes = Routes(self.ctx)
        return lambda: serve_once(self.ctx, conn, routes.lists(conn), REFRESH_S)
