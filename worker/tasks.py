"""Celery tasks: thin, with stable names; each body is one call into the pipeline modules."""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker import consolidation, eviction, importance, reembed, snapshot
from worker import drain as drain_stage
from worker.celery_app import INGEST_QUEUE, MAINT_QUEUE, app, get_context
from worker.embedding import EmbedderUnavailable
from worker.lease import LeaseLost

#: Transient failures a task retries with backoff; programming errors propagate.
TRANSIENT = (RedisConnectionError, RedisTimeoutError, LeaseLost, EmbedderUnavailable)


@app.task(
    name="zq.drain",
    autoretry_for=TRANSIENT,
    retry_backoff=True,
    retry_backoff_max=30,
    max_retries=10,
)
def drain(shard: int) -> int:
    """Organise what shard ``shard`` holds; queue another drain if work remains."""
    return drain_stage.run_drain(get_context(), shard, send_drain)


@app.task(
    name="zq.evict",
    autoretry_for=TRANSIENT,
    retry_backoff=True,
    retry_backoff_max=30,
    max_retries=10,
)
def evict() -> int:
    """Tombstone the lowest-value notes of every namespace over max_notes."""
    return eviction.evict_all(get_context())


@app.task(
    name="zq.snapshot",
    autoretry_for=TRANSIENT,
    retry_backoff=True,
    retry_backoff_max=30,
    max_retries=10,
)
def snapshot_indexes() -> int:
    """Save this process's FAISS projections to index_dir."""
    return snapshot.snapshot_all(get_context())


@app.task(
    name="zq.reembed",
    autoretry_for=TRANSIENT,
    retry_backoff=True,
    retry_backoff_max=30,
    max_retries=10,
)
def reembed_namespace(namespace: str) -> int:
    """Re-embed the notes of ``namespace`` written by another embedder than this worker's."""
    return reembed.reembed_namespace(get_context(), namespace)


@app.task(
    name="zq.importance",
    autoretry_for=TRANSIENT,
    retry_backoff=True,
    retry_backoff_max=30,
    max_retries=10,
)
def score_importance() -> int:
    """Rescore importance in the namespaces changed since their last run."""
    return importance.importance_all(get_context())


@app.task(
    name="zq.consolidate",
    autoretry_for=TRANSIENT,
    retry_backoff=True,
    retry_backoff_max=30,
    max_retries=10,
)
def consolidate() -> int:
    """Write insight notes for the new dense clusters of the namespaces written since."""
    return consolidation.consolidate_all(get_context())


def send_reembed(namespace: str) -> None:
    reembed_namespace.apply_async((namespace,), queue=MAINT_QUEUE)


def send_drain(shard: int) -> None:
    drain.apply_async((shard,), queue=INGEST_QUEUE)
