"""Prometheus metrics (extra ``zettelq[metrics]``): what the worker code counts, and the
``/metrics`` endpoint of worker and searcher processes (``ZQ_METRICS_PORT``, off by default).

The worker code calls the functions below; they do nothing unless prometheus-client is
installed, which this module imports on first use only. Celery's prefork pool runs the work in
child processes, so a worker with metrics on runs in prometheus-client's multiprocess mode:
``zettelq worker`` sets PROMETHEUS_MULTIPROC_DIR (``ZQ_METRICS_DIR``, emptied at start;
worker.cli.main) before any metric exists, every process writes its values there, the main process
serves their sum, and a child that exits is marked dead (``mark_dead``, on Celery's
worker_process_shutdown). What Redis holds (the backlog of each shard, the dead-letter stream's
length) is read at scrape time by the serving process.

Labels are bounded: ``shard`` (ZQ_SHARD_COUNT), job and thread names, error classes, LLM
purposes and failure reasons; never a note id or a namespace. See docs/operations.md.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from producer.connection import data_redis
from producer.keys import Keys
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)

#: seconds: the search and batch paths take 0.1 ms to a second, below Prometheus's defaults
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
           2.5, 5.0, 10.0)  # fmt: skip
#: jobs per batch
SIZES = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)


class _Metrics:
    """Every metric, created once prometheus-client is imported (worker.metrics imports it on
    first use only: in a prefork worker that is after PROMETHEUS_MULTIPROC_DIR is set)."""

    def __init__(self, prom: Any) -> None:
        self.prom = prom
        counter, histogram = prom.Counter, prom.Histogram
        self.jobs = counter("zettelq_jobs", "Inbox jobs drains took off the shards")
        self.dead = counter("zettelq_dead_letters", "Jobs dead-lettered (undecodable, refused)")
        self.batch_seconds = histogram(
            "zettelq_ingest_batch_seconds", "Time to apply one batch of inbox jobs", buckets=BUCKETS
        )
        self.batch_jobs = histogram(
            "zettelq_ingest_batch_jobs", "Inbox jobs per applied batch", buckets=SIZES
        )
        self.reclaimed = counter(
            "zettelq_reclaimed_entries",
            "Entries a previous holder of a shard's lease had read and left pending, applied first",
        )
        self.search_seconds = histogram(
            "zettelq_search_seconds",
            "From taking a search job to sending its reply, by kind",
            ["kind"],
            buckets=BUCKETS,
        )
        self.search_expired = counter(
            "zettelq_search_expired",
            "Search jobs dropped because their caller had given up (its ReplyTimeout)",
        )
        self.periodic_runs = counter(
            "zettelq_periodic_runs", "Runs of a periodic job over one namespace", ["job"]
        )
        self.periodic_work = counter(
            "zettelq_periodic_work", "Work periodic jobs did (notes scored, merged, ...)", ["job"]
        )
        self.llm_calls = counter(
            "zettelq_llm_calls",
            "Calls to the organising LLM that returned a valid answer",
            ["purpose"],
        )
        self.llm_tokens = counter(
            "zettelq_llm_tokens", "Tokens the organising LLM used", ["purpose"]
        )
        self.llm_failures = counter(
            "zettelq_llm_failures", "LLM calls that failed, by reason", ["reason"]
        )
        self.thread_errors = counter(
            "zettelq_thread_errors",
            "Errors a service thread survived (worker.daemon), by thread and error class",
            ["thread", "error"],
        )
        self.projection_notes = prom.Gauge(
            "zettelq_projection_notes",
            "Notes held in the projections (FAISS + BM25) of the live processes",
            multiprocess_mode="livesum",
        )
        self.projection_bytes = prom.Gauge(
            "zettelq_projection_vector_bytes",
            "Bytes of the vectors held in the projections of the live processes (float32)",
            multiprocess_mode="livesum",
        )
        self.takeovers = counter(
            "zettelq_lease_takeovers",
            "Drains that took a shard over with entries its previous holder had left pending",
        )


_made: list[_Metrics | None] = []
_lock = threading.Lock()


def _metrics() -> _Metrics | None:
    """The metrics, None without prometheus-client (every function below then does nothing)."""
    if not _made:
        with _lock:
            if not _made:
                try:
                    import prometheus_client
                except ImportError:
                    _made.append(None)
                else:
                    _made.append(_Metrics(prometheus_client))
    return _made[0]


def count_dead_letter() -> None:
    if m := _metrics():
        m.dead.inc()


def observe_batch(seconds: float, jobs: int, projection_notes: Callable[[], int], dim: int) -> None:
    """One applied batch; ``projection_notes`` is asked only when metrics are on."""
    if m := _metrics():
        m.jobs.inc(jobs)
        m.batch_seconds.observe(seconds)
        m.batch_jobs.observe(jobs)
        held = projection_notes()
        m.projection_notes.set(held)
        m.projection_bytes.set(held * dim * 4)


def count_reclaimed(entries: int) -> None:
    """A drain took over a shard and applies ``entries`` its previous holder left pending."""
    if (m := _metrics()) and entries:
        m.reclaimed.inc(entries)
        m.takeovers.inc()


def observe_search(kind: str, seconds: float) -> None:
    if m := _metrics():
        m.search_seconds.labels(kind).observe(seconds)


def count_expired_search() -> None:
    if m := _metrics():
        m.search_expired.inc()


def count_periodic(job: str, work: int) -> None:
    if m := _metrics():
        m.periodic_runs.labels(job).inc()
        m.periodic_work.labels(job).inc(work)


def count_llm(purpose: str | None, tokens: int) -> None:
    """A call that returned a valid answer, and the tokens it used."""
    if m := _metrics():
        m.llm_calls.labels(purpose or "other").inc()
        m.llm_tokens.labels(purpose or "other").inc(tokens)


def count_llm_failure(reason: str) -> None:
    if m := _metrics():
        m.llm_failures.labels(reason).inc()


def count_thread_error(thread: str, error: str) -> None:
    """``thread`` without its index (zq-search-0 counts as zq-search)."""
    if m := _metrics():
        name = thread.rsplit("-", 1)[0] if thread[-1:].isdigit() else thread
        m.thread_errors.labels(name, error).inc()


def serve(settings: WorkerSettings) -> None:
    """Serve /metrics on ZQ_METRICS_PORT (if set) from this process: every process's values in
    multiprocess mode, else this one's, plus the Redis gauges read at scrape time."""
    if not settings.metrics_port:
        return
    m = _metrics()
    if m is None:
        raise ModuleNotFoundError(
            "ZQ_METRICS_PORT needs prometheus-client", name="prometheus_client"
        )
    prom = m.prom
    prom.disable_created_metrics()  # no *_created series beside each counter and histogram
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = prom.CollectorRegistry(support_collectors_without_names=True)
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry = prom.REGISTRY
    registry.register(RedisCollector(settings))
    prom.start_http_server(settings.metrics_port, addr=settings.metrics_host, registry=registry)
    log.info("metrics on http://%s:%d/metrics", settings.metrics_host, settings.metrics_port)


def mark_dead(pid: int) -> None:
    """A pool child exited: drop its live gauges from the sum (multiprocess mode only)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR") and _metrics():
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


class RedisCollector:
    """Gauges read from Redis at scrape time: each shard's backlog, the dead-letter stream."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.keys = Keys.of(settings)
        self.redis = data_redis(settings)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        backlog = GaugeMetricFamily(
            "zettelq_backlog_entries", "Jobs waiting in a shard's inbox stream", labels=["shard"]
        )
        dead = GaugeMetricFamily("zettelq_dead_letter_entries", "Jobs in the dead-letter stream")
        up = GaugeMetricFamily("zettelq_redis_up", "Whether Redis answered this scrape")
        try:
            pipe = self.redis.pipeline(transaction=False)
            for shard in range(self.keys.shard_count):
                pipe.xlen(self.keys.inbox(shard))
            pipe.xlen(self.keys.dead())
            *lengths, dead_len = pipe.execute()
        except Exception as exc:  # a scrape reports Redis down, it does not fail
            log.warning("metrics: Redis did not answer: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        for shard, length in enumerate(lengths):
            backlog.add_metric([str(shard)], int(length))
        dead.add_metric([], int(dead_len))
        up.add_metric([], 1)
        yield from (backlog, dead, up)
