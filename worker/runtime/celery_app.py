"""The Celery app: configuration from WorkerSettings, queues and beat schedule (the process hooks
are in worker/runtime/process.py, the tasks in worker/runtime/tasks.py).

Queues: ``<prefix>.ingest`` carries drain tasks, ``<prefix>.maint`` the periodic ones (prefix =
ZQ_KEY_PREFIX, so deployments sharing a broker never run each other's tasks). Notes never travel
through Celery: they wait in the shard streams. Each worker's main process runs the dispatcher;
each pool process serves searches and organise() requests from threads (see worker.runtime.servers
and worker.runtime.organiser).

Beat uses celery-redbeat: the schedule and a leader lock live in the broker Redis under
``<prefix>:redbeat``, so any number of beat processes may run and exactly one sends tasks; when
it dies the lock expires after ``beat_lock_s`` and a standby takes over within ``beat_tick_s``
more, continuing the schedule where the old leader left it. A broker behind Sentinel
(ZQ_BROKER_URL=redis+sentinel://...) goes through kombu's sentinel transport and redbeat's
sentinel client. Every worker's main process, and
every beat, keeps a heartbeat in Redis for ``zettelq health`` (worker.runtime.heartbeat,
worker.runtime.beat).
"""

from __future__ import annotations

import os

from celery import Celery
from kombu import Queue

from producer.keys import Keys
from worker.runtime.schedule import build_beat_schedule
from worker.settings import WorkerSettings, warn_unknown_variables

settings = WorkerSettings()
warn_unknown_variables(os.environ)

INGEST_QUEUE = f"{settings.key_prefix}.ingest"  #: drain tasks
MAINT_QUEUE = f"{settings.key_prefix}.maint"  #: periodic and on-demand maintenance

REDBEAT_URL, REDBEAT_OPTIONS = settings.redbeat_redis

app = Celery(
    "zettelq", broker=settings.broker, include=["worker.runtime.tasks", "worker.runtime.process"]
)
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
    broker_transport_options=settings.broker_transport_options,
    beat_schedule=build_beat_schedule(settings),
    beat_scheduler="worker.runtime.beat:LeaderScheduler",
    beat_max_loop_interval=settings.beat_tick_s,
    redbeat_redis_url=REDBEAT_URL,
    redbeat_redis_options=REDBEAT_OPTIONS,
    redbeat_key_prefix=Keys(settings.key_prefix).redbeat(),
    redbeat_lock_timeout=settings.beat_lock_s,
    worker_hijack_root_logger=True,
)


def send_drain(shard: int) -> None:
    """Queue a drain of ``shard`` (by task name, so the app needs no import of its tasks)."""
    app.send_task("zq.drain", (shard,), queue=INGEST_QUEUE)
