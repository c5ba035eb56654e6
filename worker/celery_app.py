"""The Celery app: configuration from WorkerSettings, queues, beat schedule, process hooks.

Queues: ``<prefix>.ingest`` carries drain tasks, ``<prefix>.maint`` the periodic ones (prefix =
ZQ_KEY_PREFIX, so deployments sharing a broker never run each other's tasks). Notes never travel
through Celery: they wait in the shard streams. Each worker's main process runs the dispatcher;
each pool process serves searches and organise() requests from threads (see worker.server and
worker.organiser).

Beat uses celery-redbeat: the schedule and a leader lock live in the broker Redis under
``<prefix>:redbeat``, so any number of beat processes may run and exactly one sends tasks; when
it dies the lock expires after ``beat_lock_s`` and a standby takes over within ``beat_tick_s``
more, continuing the schedule where the old leader left it. Every worker's main process, and
every beat, keeps a heartbeat in Redis for ``zettelq health`` (worker.heartbeat, worker.beat).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import Celery, signals
from kombu import Queue
from redis import Redis

from producer.core import redis_kwargs
from producer.keys import Keys
from worker import metrics, redis_config, tracing
from worker.context import WorkerContext
from worker.dispatch import Dispatcher
from worker.heartbeat import ProcessHeartbeat
from worker.organiser import OrganiseServer
from worker.schedule import build_beat_schedule
from worker.server import SearchServer
from worker.settings import WorkerSettings, warn_unknown_variables
from worker.snapshot import Snapshotter

log = logging.getLogger(__name__)

settings = WorkerSettings()
warn_unknown_variables(os.environ)

INGEST_QUEUE = f"{settings.key_prefix}.ingest"  #: drain tasks
MAINT_QUEUE = f"{settings.key_prefix}.maint"  #: periodic and on-demand maintenance

app = Celery("zettelq", broker=settings.broker, include=["worker.tasks"])
app.conf.update(
    task_default_queue=MAINT_QUEUE,
    task_queues=(Queue(INGEST_QUEUE), Queue(MAINT_QUEUE)),
    task_routes={"zq.drain": {"queue": INGEST_QUEUE}},
    task_ignore_result=True,
    task_acks_late=False,
    worker_prefetch_multiplier=1,
    worker_concurrency=1,
    worker_soft_shutdown_timeout=settings.soft_shutdown_s,
    broker_connection_retry_on_startup=True,
    beat_schedule=build_beat_schedule(settings),
    beat_scheduler="worker.beat:LeaderScheduler",
    beat_max_loop_interval=settings.beat_tick_s,
    redbeat_redis_url=settings.broker,
    redbeat_key_prefix=Keys(settings.key_prefix).redbeat(),
    redbeat_lock_timeout=settings.beat_lock_s,
    worker_hijack_root_logger=True,
)

_state: dict[str, Any] = {}


def get_context() -> WorkerContext:
    """This process's WorkerContext, built on first use."""
    ctx = _state.get("ctx")
    if ctx is None:
        ctx = _state["ctx"] = WorkerContext.build(settings)
    return ctx


def _start_servers() -> None:
    if settings.serve_search:
        _state["server"] = SearchServer(get_context(), settings.search_threads).start()
    _state["organiser"] = OrganiseServer(get_context()).start()
    _state["snapshotter"] = Snapshotter(get_context()).start()


@signals.worker_process_init.connect
def _on_pool_process(**_: object) -> None:
    _state.clear()
    tracing.instrument(settings)
    _start_servers()


@signals.worker_ready.connect
def _on_worker_ready(sender: Any = None, **_: object) -> None:
    from worker.tasks import send_drain

    with Redis.from_url(settings.redis_url, **redis_kwargs(settings)) as r:
        try:
            redis_config.check_at_start(r)
        except redis_config.UnsupportedRedis as exc:
            log.critical("%s", exc)
            raise SystemExit(1) from exc
    _state["heartbeat"] = ProcessHeartbeat(settings, "worker").start()
    _state["dispatcher"] = Dispatcher(settings, send_drain).start()
    metrics.serve(settings)
    if app.conf.worker_pool != "prefork":
        tracing.instrument(settings)
        _start_servers()
    log.info("zettelq worker ready: shards=%d", settings.shard_count)


@signals.worker_process_shutdown.connect
def _on_pool_process_exit(pid: int | None = None, **_: object) -> None:
    metrics.mark_dead(pid or os.getpid())


@signals.worker_shutdown.connect
def _on_shutdown(**_: object) -> None:
    for name in ("heartbeat", "dispatcher", "server", "organiser", "snapshotter"):
        if name in _state:
            _state.pop(name).stop()
