"""Serving organise() requests: a thread per worker process BRPOPs OrganiseJobs and runs every
periodic job for the namespace (``organise``), replying with the runs.

It runs beside the search threads, not on them, so a long organise never delays a search.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from producer import validation
from producer.errors import InvalidInput, ProtocolError
from producer.protocol import JobRun, OrganiseJob, Reply, unpack
from worker.context import WorkerContext
from worker.errors import JobError, NotFresh, SignatureRejected, UnknownJob
from worker.intake.freshness import wait_fresh
from worker.intake.signing import check_signature
from worker.organise import periodic
from worker.runtime.servers import POLL_S, JobServer, execute_reply, is_key_error, send_reply
from worker.search.retrieve import check_deadline

log = logging.getLogger(__name__)


def serve_once(ctx: WorkerContext, conn: Redis, timeout_s: float = POLL_S) -> bool:
    """Take one organise job (waiting up to ``timeout_s``), run it and reply when the caller
    waits; False when none came."""
    got = conn.brpop([ctx.keys.organise_queue()], timeout=timeout_s)
    if got is None:
        return False
    try:
        job = unpack(OrganiseJob, got[1])
    except ProtocolError as exc:
        log.warning("dropped undecodable organise job: %s", exc)
        return True
    reply = handle(ctx, job, got[1])
    if reply is not None and job.wait:
        pipe = ctx.redis.pipeline(transaction=False)
        send_reply(ctx, pipe, reply)
        execute_reply(pipe, reply.job_id)
    return True


def handle(ctx: WorkerContext, job: OrganiseJob, payload: bytes) -> Reply | None:
    """Run ``job``; None when its caller has already given up on it."""
    if job.wait and time.time() > job.deadline:
        log.warning("dropped expired organise job_id=%s", job.job_id)
        return None
    deadline = job.deadline if job.wait else time.time() + ctx.settings.organise_timeout_s
    try:
        validation.check_namespace(job.namespace)
        validation.check_job_names(job.jobs)
        check_deadline(job.deadline, time.time())
        check_signature(ctx.settings, payload, [job.namespace])
        runs = organise(ctx, job.namespace, job.jobs, deadline)
    except SignatureRejected as exc:
        log.warning("refused organise job_id=%s: %s", job.job_id, exc)
        return Reply(job_id=job.job_id, ok=False, error=f"refused: {exc}")
    except RedisError as exc:
        if not is_key_error(exc):
            raise  # Redis is away, busy or refusing writes: the thread backs off (worker.daemon)
        log.warning("organise job_id=%s failed on a key: %s", job.job_id, exc)
        return Reply(job_id=job.job_id, ok=False, error=f"worker error: {exc}")
    except (InvalidInput, UnknownJob, JobError, NotFresh) as exc:
        return Reply(job_id=job.job_id, ok=False, error=str(exc))
    except Exception as exc:
        log.exception("organise job_id=%s failed", job.job_id)
        return Reply(job_id=job.job_id, ok=False, error=f"worker error: {exc!r}")
    return Reply(job_id=job.job_id, runs=runs)


def organise(
    ctx: WorkerContext, ns: str, jobs: Sequence[str] | None, deadline: float
) -> list[JobRun]:
    """Organise what is queued for ``ns`` (before ``deadline``), then run every job, or those
    named in ``jobs``, over it in periodic.JOBS order; return their runs."""
    unknown = sorted(set(jobs or ()) - set(periodic.JOBS))
    if unknown:
        raise UnknownJob(f"unknown jobs {unknown}; this worker runs {list(periodic.JOBS)}")
    wait_fresh(ctx, [ns], deadline)
    runs = []
    for job in periodic.JOBS:
        if jobs is not None and job not in jobs:
            continue
        try:
            runs.append(periodic.run_job(ctx, job, ns))
        except (RedisConnectionError, RedisTimeoutError):
            raise
        except Exception as exc:
            log.exception("job=%s ns=%s failed", job, ns)
            raise JobError(f"job {job} failed on {ns}: {exc!r}") from exc
    return runs


class OrganiseServer(JobServer):
    """A daemon thread serving organise jobs until ``stop()``."""

    thread_name = "zq-organise"

    def server(self, conn: Redis) -> Callable[[], bool]:
        return lambda: serve_once(self.ctx, conn)
