"""OpenTelemetry, if it is installed (extra ``zettelq[otel]``); nothing at all otherwise.

A producer call runs in a span of its own (``zettelq store``, kind PRODUCER; ``zettelq search``,
CLIENT), child of whatever span the agent is in, and its W3C ``traceparent`` travels inside the
job (field ``tp``): the worker's batch span links to the spans of every store it organised, and
its search span is the child of the caller's (worker/tracing.py). Spans are made only when the
application installed a tracer provider (the SDK's, or any other real one); with the API alone a
call opens none (a no-op span cost a store about 10 us), and the traceparent a job carries is
still the caller's, when the caller's context holds one.
opentelemetry is imported on the first call, not with ``producer``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: the modules once looked up: [(trace, propagate)] or [None] when opentelemetry is missing
_found: list[tuple[Any, Any] | None] = []


def otel() -> tuple[Any, Any] | None:
    """opentelemetry's ``trace`` and ``propagate`` modules, or None when not installed."""
    if not _found:
        try:
            from opentelemetry import propagate, trace
        except ImportError:
            _found.append(None)
        else:
            _found.append((trace, propagate))
    return _found[0]


@contextmanager
def span(name: str, kind: str, namespace: str | None = None) -> Iterator[None]:
    """Run the block in a span ``name`` of SpanKind ``kind`` (PRODUCER, CLIENT, ...), with the
    ``zettelq.namespace`` attribute when one is given."""
    found = otel()
    if found is None or not _provided(found[0]):
        yield
        return
    trace, _ = found
    attributes = {"messaging.system": "zettelq"}
    if namespace is not None:
        attributes["zettelq.namespace"] = namespace
    tracer = trace.get_tracer("zettelq")
    with tracer.start_as_current_span(name, kind=trace.SpanKind[kind], attributes=attributes):
        yield


def traceparent() -> str | None:
    """The W3C traceparent of the current span when one is recording, else None."""
    found = otel()
    if found is None:
        return None
    carrier: dict[str, str] = {}
    found[1].inject(carrier)
    return carrier.get("traceparent")


def _provided(trace: Any) -> bool:
    """Whether a tracer provider that makes spans is installed (not the API's proxy or no-op)."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
