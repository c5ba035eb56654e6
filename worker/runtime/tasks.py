"""Celery tasks: thin, with stable names; each body is one call into the pipeline modules."""

from __future__ import annotations

from worker.errors import TRANSIENT
from worker.intake import drain as drain_stage
from worker.organise import periodic, reembed
from worker.runtime.celery_app import MAINT_QUEUE, app, send_drain
from worker.runtime.process import get_context


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
    name="zq.periodic",
    autoretry_for=TRANSIENT,
    retry_backoff=True,
    retry_backoff_max=30,
    max_retries=10,
)
def run_periodic(job: str) -> int:
    """Run the periodic job ``job`` over the namespaces due for it (see
    worker.organise.periodic)."""
    return periodic.run_periodic(get_context(), job)


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


def send_reembed(namespace: str) -> None:
    reembed_namespace.apply_async((namespace,), queue=MAINT_QUEUE)
