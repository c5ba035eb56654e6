"""Celery tasks: thin, with stable names; each body is one call into the pipeline modules."""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker import drain as drain_stage
from worker import eviction, snapshot
from worker.celery_app import app, get_context
from worker.lease import LeaseLost

#: Transient failures a task retries with backoff; programming errors propagate.
TRANSIENT = (RedisConnectionError, RedisTimeoutError, LeaseLost)


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


def send_drain(shard: int) -> None:
    drain.apply_async((shard,), queue="zq.ingest")
