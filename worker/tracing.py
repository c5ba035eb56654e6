"""The worker's OpenTelemetry spans (extra ``zettelq[otel]``; nothing without it).

- ``zettelq organise`` (CONSUMER): one per batch a drain applies, with a span link to the
  producer span of every job in it that carried one (``tp``, producer/tracing.py) and the
  messaging attributes of batch processing.
- ``zettelq search|context|flush`` (SERVER): one per search job, child of the caller's span.
- Celery's own spans (opentelemetry-instrumentation-celery) in every pool process, and with
  ``ZQ_OTEL_REDIS=true`` one span per Redis command (noisy: off by default).

A ``tp`` read from Redis is untrusted: anything that is not a W3C traceparent is ignored (the
job is organised all the same).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from producer.tracing import otel
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)

MAX_TRACEPARENT = 128  #: longer values are not traceparents (55 characters in version 00)


def _context(traceparent: str | None) -> Any:
    """The span context a traceparent names, or None for a missing or malformed one."""
    found = otel()
    if found is None or not traceparent or len(traceparent) > MAX_TRACEPARENT:
        return None
    trace, propagate = found
    ctx = trace.get_current_span(propagate.extract({"traceparent": traceparent}))
    span_context = ctx.get_span_context()
    return span_context if span_context.is_valid else None


@contextmanager
def batch_span(shard: int, jobs: int, traceparents: Iterable[str | None]) -> Iterator[None]:
    """The span of one applied batch, linked to the producer spans of its jobs."""
    found = otel()
    if found is None:
        yield
        return
    trace, _ = found
    contexts = [c for c in map(_context, traceparents) if c is not None]
    attributes = {
        "messaging.system": "zettelq",
        "messaging.operation.type": "process",
        "messaging.destination.name": f"shard-{shard}",
        "messaging.batch.message_count": jobs,
    }
    tracer = trace.get_tracer("zettelq")
    with tracer.start_as_current_span(
        "zettelq organise",
        kind=trace.SpanKind.CONSUMER,
        links=[trace.Link(c) for c in contexts],
        attributes=attributes,
    ):
        yield


@contextmanager
def served_span(kind: str, traceparent: str | None) -> Iterator[None]:
    """The span of serving one search job, child of its caller's span (when it sent one)."""
    found = otel()
    if found is None:
        yield
        return
    trace, _ = found
    parent = _context(traceparent)
    context = trace.set_span_in_context(trace.NonRecordingSpan(parent)) if parent else None
    tracer = trace.get_tracer("zettelq")
    with tracer.start_as_current_span(
        f"zettelq {kind}",
        context=context,
        kind=trace.SpanKind.SERVER,
        attributes={"messaging.system": "zettelq"},
    ):
        yield


def instrument(settings: WorkerSettings) -> None:
    """Celery's spans (and Redis's with ``otel_redis``), in a pool process after the fork."""
    if otel() is None:
        return
    try:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor
    except ImportError:
        log.info("opentelemetry-instrumentation-celery is not installed: no Celery spans")
    else:
        CeleryInstrumentor().instrument()  # type: ignore[no-untyped-call]
    if settings.otel_redis:
        from opentelemetry.instrumentation.redis import RedisInstrumentor

        RedisInstrumentor().instrument()
