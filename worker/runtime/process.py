"""What each worker process holds and starts: its WorkerContext (built on first use), and the
Celery signal hooks that start and stop its threads: in the main process the heartbeat, the
dispatcher and the metrics endpoint; in each pool process (or the main one, without prefork) the
search, organise and snapshot threads. Celery imports this module with the tasks (the app's
``include``)."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from celery import signals

from producer.connection import data_redis
from worker import metrics, tracing
from worker.context import WorkerContext
from worker.errors import UnsupportedRedis
from worker.intake.dispatch import Dispatcher
from worker.runtime import redis_config
from worker.runtime.celery_app import app, send_drain, settings
from worker.runtime.heartbeat import ProcessHeartbeat
from worker.runtime.organiser import OrganiseServer
from worker.runtime.servers import SearchServer
from worker.runtime.snapshotter import Snapshotter

log = logging.getLogger(__name__)

_state: dict[str, Any] = {}


def get_context() -> WorkerContext:
    """This process's WorkerContext, built on first use."""
    ctx = _state.get("ctx")
    if ctx is None:
        ctx = _state["ctx"] = WorkerContext.build(settings)
    return ctx


def _start_servers() -> None:
    sys.setswitchinterval(settings.switch_interval_ms / 1000)
    log.info(
        "process %d serves: search threads=%d, switch interval %g ms",
        os.getpid(),
        settings.search_threads if settings.serve_search else 0,
        settings.switch_interval_ms,
    )
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
    with data_redis(settings) as r:
        try:
            redis_config.check_at_start(r)
        except UnsupportedRedis as exc:
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
    """In a pool process that exits cleanly (a warm shutdown): its last snapshots, then its
    metrics marked dead. A cold shutdown kills pool processes before this runs."""
    snapshotter = _state.pop("snapshotter", None)
    if snapshotter is not None:
        snapshotter.stop()
    metrics.mark_dead(pid or os.getpid())


@signals.worker_shutdown.connect
def _on_shutdown(**_: object) -> None:
    for name in ("heartbeat", "dispatcher", "server", "organiser", "snapshotter"):
        if name in _state:
            _state.pop(name).stop()
