"""OpenTelemetry: with the SDK's in-memory exporter, an agent's store() makes a producer span,
the batch that organised it a consumer span linked to it, and a search a client span whose
child is the worker's span; without opentelemetry nothing changes and no job carries a trace.

Each case runs in a process of its own, so that no tracer provider is left behind in the test
session (OpenTelemetry allows one per process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from tests.conftest import drain_all
from worker.settings import WorkerSettings

pytest.importorskip("opentelemetry.sdk", reason="pip install -e '.[otel]' to run this")

ROOT = Path(__file__).resolve().parents[2]

TRACED = """
import json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from producer import MemoryClient
from tests.conftest import drain_all
from worker.context import WorkerContext
from worker.runtime.servers import SearchServer
from worker.settings import WorkerSettings

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
settings = WorkerSettings()
ctx = WorkerContext.build(settings)
server = SearchServer(ctx).start()
with MemoryClient(settings) as mem:
    with trace.get_tracer("agent").start_as_current_span("agent step"):
        mem.store("the rover landed in the crater", namespace="traced")
        mem.store_many(["the crater holds ice", "the ice is old"], namespace="traced")
    drain_all(ctx)
    with trace.get_tracer("agent").start_as_current_span("agent question"):
        mem.search("crater ice", namespace="traced")
server.stop()
spans = [
    {
        "name": s.name,
        "kind": s.kind.name,
        "id": s.context.span_id,
        "trace": s.context.trace_id,
        "parent": s.parent.span_id if s.parent else None,
        "links": [[link.context.trace_id, link.context.span_id] for link in s.links],
        "attributes": dict(s.attributes or {}),
    }
    for s in exporter.get_finished_spans()
]
print(json.dumps(spans))
"""

UNTRACED = """
import sys
sys.modules["opentelemetry"] = None  # not installed
import msgpack
from producer import MemoryClient
from producer.tracing import otel
from worker.settings import WorkerSettings

assert otel() is None
settings = WorkerSettings()
with MemoryClient(settings) as mem:
    mem.store("nothing traced here", namespace="plain")
    inbox = mem.keys.inbox(mem.keys.shard_of("plain"))
    ((_, fields),) = mem._redis.xrange(inbox)
    print("tp" in msgpack.unpackb(fields[b"j"]))
"""

API_ONLY = """
import msgpack
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, use_span
from producer import MemoryClient
from worker.settings import WorkerSettings


def refuse(*args, **kwargs):
    raise AssertionError("a span was opened with no tracer provider installed")


trace.get_tracer = refuse  # the API alone: no SDK, so no span is worth opening
caller = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(1))
settings = WorkerSettings()
with MemoryClient(settings) as mem:
    mem.store("no span opened", namespace="bare")
    with use_span(NonRecordingSpan(caller)):  # a context the caller took from a request
        mem.store("carried on", namespace="bare")
    inbox = mem.keys.inbox(mem.keys.shard_of("bare"))
    jobs = [msgpack.unpackb(fields[b"j"]) for _, fields in mem._redis.xrange(inbox)]
print([job.get("tp") for job in jobs])
"""


def run(script: str, settings: WorkerSettings) -> str:
    env = {
        "ZQ_REDIS_URL": settings.redis_url,
        "ZQ_KEY_PREFIX": settings.key_prefix,
        "ZQ_SHARD_COUNT": str(settings.shard_count),
        "ZQ_INDEX_DIR": str(settings.index_dir),
        "ZQ_BATCH_WAIT_MS": "0",
        "PATH": "/usr/bin:/bin",
    }
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_store_links_to_the_batch_and_search_parents_the_worker_span(
    settings: WorkerSettings,
) -> None:
    spans = json.loads(run(TRACED, settings))
    by_name: dict[str, list[dict]] = {}
    for span in spans:
        by_name.setdefault(span["name"], []).append(span)
    (step,) = by_name["agent step"]
    producers = by_name["zettelq store"] + by_name["zettelq store_many"]
    assert len(producers) == 2
    assert all(p["kind"] == "PRODUCER" and p["parent"] == step["id"] for p in producers)
    assert all(p["attributes"]["zettelq.namespace"] == "traced" for p in producers)
    (batch,) = [s for s in by_name["zettelq organise"] if s["links"]]
    assert batch["kind"] == "CONSUMER"
    assert batch["attributes"]["messaging.batch.message_count"] == 3
    assert sorted(batch["links"]) == sorted(
        [p["trace"], p["id"]]
        for p in producers
        for _ in (range(1 if p["name"] == "zettelq store" else 2))
    )  # one link per job: store_many's two jobs both link to its span
    (question,) = by_name["agent question"]
    (client,) = [s for s in by_name["zettelq search"] if s["kind"] == "CLIENT"]
    (served,) = [s for s in by_name["zettelq search"] if s["kind"] == "SERVER"]
    assert client["parent"] == question["id"]
    assert served["parent"] == client["id"] and served["trace"] == client["trace"]


def test_without_opentelemetry_nothing_is_traced(settings: WorkerSettings) -> None:
    assert run(UNTRACED, settings) == "False"


def test_with_the_api_alone_no_span_is_opened_and_the_callers_context_still_travels(
    settings: WorkerSettings,
) -> None:
    carried = f"00-{0x1234:032x}-{0x5678:016x}-01"
    assert run(API_ONLY, settings) == str([None, carried])


def test_a_malformed_traceparent_from_redis_is_ignored(settings, ctx, client) -> None:
    inbox = ctx.keys.inbox(ctx.keys.shard_of("odd"))
    for tp in ("garbage", "00-" + "f" * 500, ""):
        job = {"v": 1, "op": "store", "id": f"n{len(tp)}", "ns": "odd", "content": "text"}
        job |= {"created_at": 1.0, "tp": tp}
        ctx.redis.xadd(inbox, {"j": msgpack.packb(job)})
    drain_all(ctx)
    assert client.stats("odd").notes == 3 and client.stats("odd").dead == 0
