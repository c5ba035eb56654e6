"""Search serving: threads that BRPOP search jobs and LPUSH replies (no Celery hop).

Every worker process runs ``search_threads`` of them against its own projections. They wait on
the lists of the shards their process drains, of the shards no live search server drains, of
shards with a backlog, and on the shared list (worker/search/routing.py): a namespace's searches go
to the process whose projections of it are current, and adding workers adds search capacity.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Self

from redis import Redis
from redis.client import Pipeline
from redis.cluster import RedisCluster
from redis.exceptions import RedisError, ResponseError

from producer.connection import data_redis
from producer.errors import ProtocolError
from producer.protocol import Reply, SearchJob, pack, unpack
from worker import metrics, tracing
from worker.bulk import BulkPipeline, pinned
from worker.context import WorkerContext
from worker.daemon import Daemon
from worker.errors import SignatureRejected
from worker.intake.signing import check_signature
from worker.search import retrieve as search
from worker.search.replies import pack_reply
from worker.search.routing import REFRESH_S, Heartbeat, Routes

log = logging.getLogger(__name__)

POLL_S = 1.0  #: BRPOP timeout, so that stop() is noticed within a second
KEY_ERRORS = ("WRONGTYPE", "value is not an integer")  #: error replies about one key's value


def serve_once(
    ctx: WorkerContext,
    conn: Redis,
    lists: list[str],
    timeout_s: float,
    record: Callable[[float], None] | None = None,
    lookahead: search.Lookahead | None = None,
) -> bool:
    """Take one search job from ``lists`` (waiting up to ``timeout_s``) and reply; False when
    none came. ``record`` gets the seconds from taking the job to sending its reply; with a
    ``lookahead``, its reads are made behind the BRPOP, in the same round trip."""
    got, ahead = take(conn, lists, timeout_s, lookahead)
    if got is None:
        return False
    started = time.perf_counter()
    try:
        job = unpack(SearchJob, got[1])
    except ProtocolError as exc:
        log.warning("dropped undecodable search job: %s", exc)
        return True
    try:
        check_signature(ctx.settings, got[1], job.namespaces)
        with tracing.served_span(job.kind, job.tp):
            reply = search.handle(ctx, job, ahead)
    except SignatureRejected as exc:
        log.warning("refused %s job_id=%s: %s", job.kind, job.job_id, exc)
        reply = Reply(job_id=job.job_id, ok=False, error=f"refused: {exc}")
    except RedisError as exc:
        if not is_key_error(exc):
            raise  # Redis is away, busy or refusing writes: the thread backs off (worker.daemon)
        log.warning("search job_id=%s failed on a key: %s", job.job_id, exc)
        reply = Reply(job_id=job.job_id, ok=False, error=f"worker error: {exc}")
    except Exception as exc:
        log.exception("search job_id=%s failed", job.job_id)
        reply = Reply(job_id=job.job_id, ok=False, error=f"worker error: {exc!r}")
    if lookahead is not None:
        lookahead.remember(job)
    if reply is not None:
        answer(ctx, job, reply)
        took = time.perf_counter() - started
        metrics.observe_search(job.kind, took)
        if record is not None:
            record(took)
    return True


def take(
    conn: Redis | RedisCluster,
    lists: list[str],
    timeout_s: float,
    lookahead: search.Lookahead | None,
) -> tuple[list[bytes] | None, search.Probe | None]:
    """BRPOP a job from ``lists``: (list, job) or None after ``timeout_s``, and the
    lookahead's reads made right after it (None when there are none, or one of them failed:
    the search then makes them itself). Not on a cluster, whose nodes would run the reads
    apart from the BRPOP, so maybe before the job came."""
    if lookahead is None or isinstance(conn, RedisCluster):
        return conn.brpop(lists, timeout=timeout_s), None
    pipe = BulkPipeline(conn)
    pipe.queue("BRPOP", *lists, timeout_s)
    ahead = lookahead.queue(pipe)
    replies = pipe.execute(raise_on_error=False)
    if isinstance(replies[0], ResponseError):
        raise replies[0]
    if ahead is not None and not any(isinstance(r, ResponseError) for r in replies):
        ahead.replies = replies
        return replies[0], ahead
    return replies[0], None


def answer(ctx: WorkerContext, job: SearchJob, reply: Reply) -> None:
    """Send the reply, and reinforce its hits in the same round trip when the job asks to
    (first: the caller's BLPOP then wakes as this process's replies come back, not before the
    reinforcement is applied, so this process is free for the next search when the caller is)."""
    pipe = BulkPipeline(ctx.redis)
    counted = search.touch(ctx, pipe, reply.hits, time.time()) if job.reinforce else None
    send_reply(ctx, pipe, reply)
    replies = execute_reply(pipe, reply.job_id)
    if counted is not None and replies is not None:
        counted(replies)


class Latencies:
    """The durations of the searches a process served in the last WINDOW_S (at most MAX_KEPT),
    summarised for `zettelq top` by the search heartbeat (worker/search/routing.py)."""

    WINDOW_S = 60.0
    MAX_KEPT = 100_000

    def __init__(self) -> None:
        self._seen: deque[tuple[float, float]] = deque(maxlen=self.MAX_KEPT)

    def add(self, seconds: float) -> None:
        self._seen.append((time.monotonic(), seconds))

    def summary(self) -> dict[str, float]:
        """``searches`` in the window and their ``p50_ms`` and ``p99_ms`` (0 when none)."""
        cutoff = time.monotonic() - self.WINDOW_S
        recent = sorted(took for at, took in list(self._seen) if at >= cutoff)
        if not recent:
            return {"searches": 0, "p50_ms": 0.0, "p99_ms": 0.0}
        return {
            "searches": len(recent),
            "p50_ms": _quantile(recent, 0.5) * 1000,
            "p99_ms": _quantile(recent, 0.99) * 1000,
        }


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def is_key_error(exc: RedisError) -> bool:
    """True for an error reply about one key (a key of the wrong type, or a counter that holds
    no integer, which anyone who may write it can plant): the job fails, the thread goes on.
    Errors of the server (OOM, BUSY, READONLY, MISCONF, a lost connection) are not."""
    return isinstance(exc, ResponseError) and str(exc).startswith(KEY_ERRORS)


def send_reply(ctx: WorkerContext, pipe: Pipeline, reply: Reply) -> None:
    """Queue ``reply`` on ``pipe``, for its caller's BLPOP (kept ``result_ttl_s``). A reply that
    cannot be packed (a value msgpack refuses) is replaced by a failed one saying so."""
    try:
        payload = pack_reply(reply)
    except ProtocolError as exc:
        log.error("the reply to job_id=%s could not be packed: %s", reply.job_id, exc)
        error = f"worker error: the reply could not be packed ({exc})"
        payload = pack(Reply(job_id=reply.job_id, ok=False, error=error))
    key = ctx.keys.reply(reply.job_id)
    pipe.lpush(key, payload)
    pipe.expire(key, ctx.settings.result_ttl_s)


def execute_reply(pipe: Pipeline, job_id: str) -> list[Any] | None:
    """Send the reply queued on ``pipe`` and return the pipeline's replies; a key of the wrong
    type loses that reply (its caller times out) and nothing else (None)."""
    try:
        return list(pipe.execute())
    except ResponseError as exc:
        if not is_key_error(exc):
            raise
        log.warning("could not reply to job_id=%s: %s", job_id, exc)
        return None


class JobServer(Daemon):
    """``threads`` daemon threads, each calling what ``server`` returns over its own Redis
    connection until ``stop()``; subclasses say what one call serves."""

    thread_name = "zq-jobs"  #: threads are named <thread_name>-<i>

    def __init__(self, ctx: WorkerContext, threads: int = 1) -> None:
        super().__init__(threads)
        self.ctx = ctx

    @contextmanager
    def session(self) -> Iterator[Callable[[], bool]]:
        s = self.ctx.settings
        conn = data_redis(s, socket_timeout=POLL_S + s.socket_timeout_s)
        try:
            with pinned(self.ctx.redis), pinned(conn):
                yield self.server(conn)
        finally:
            conn.close()

    def server(self, conn: Redis) -> Callable[[], bool]:
        """What one thread calls in its loop: serve one job (or wait for one) over ``conn``."""
        raise NotImplementedError


class SearchServer(JobServer):
    """Search threads, and the heartbeat that tells other processes this one serves the
    searches of the shards it drains (worker/search/routing.py)."""

    thread_name = "zq-search"

    def __init__(self, ctx: WorkerContext, threads: int = 1) -> None:
        super().__init__(ctx, threads)
        self.latencies = Latencies()
        self._heartbeat = Heartbeat(
            ctx, healthy=lambda: not self.problems(), stats=self.latencies.summary
        )

    def start(self) -> Self:
        super().start()
        self._heartbeat.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        super().stop(timeout_s)
        self._heartbeat.stop(timeout_s)

    def server(self, conn: Redis) -> Callable[[], bool]:
        routes, lookahead = Routes(self.ctx), search.Lookahead(self.ctx)
        return lambda: serve_once(
            self.ctx, conn, routes.lists(conn), REFRESH_S, self.latencies.add, lookahead
        )
