"""What reaches a worker from Redis is untrusted: a job the producer would refuse is dead-lettered
with its reason and harms nothing, and whatever the producer accepts is organised and renders
on every read path (search reply, context, get, the CLI's JSON)."""

from __future__ import annotations

import io
import json
import math
import time
import uuid
from contextlib import redirect_stdout
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings

from producer.errors import InvalidInput
from producer.protocol import PROTOCOL_VERSION
from tests.conftest import drain_all
from tests.strategies import accepted_store_fields, accepted_texts
from worker.cli.console import Printer
from worker.runtime import organiser


def _raw_store(ns: str, **fields: Any) -> dict[bytes, bytes]:
    job = {
        "v": PROTOCOL_VERSION,
        "op": "store",
        "id": uuid.uuid4().hex,
        "ns": ns,
        "content": "an ordinary note",
        "created_at": time.time(),
        **fields,
    }
    return {b"j": msgpack.packb(job, use_bin_type=True)}


def _nested(depth: int) -> object:
    value: object = "leaf"
    for _ in range(depth):
        value = [value]
    return value


BAD_FIELDS = [
    ("importance", math.nan),
    ("importance", 7.0),
    ("importance", -3.0),
    ("event_time", math.inf),
    ("event_time", math.nan),
    ("event_time", 253_402_300_799.0),  # 9999-12-31
    ("agent", "a" * 200_000),
    ("created_at", math.nan),
    ("metadata", {"deep": _nested(900)}),
]


def test_jobs_the_producer_would_refuse_are_dead_lettered_and_nothing_else_is_harmed(
    ctx, client
) -> None:
    ns = "untrusted"
    inbox = ctx.keys.inbox(ctx.keys.shard_of(ns))
    for name, value in BAD_FIELDS:
        ctx.redis.xadd(inbox, _raw_store(ns, **{name: value}))
    good = client.store("the one good note", namespace=ns)

    drain_all(ctx)

    dead = ctx.redis.xrange(ctx.keys.dead())
    assert len(dead) == len(BAD_FIELDS)
    reasons = [fields[b"reason"].decode() for _, fields in dead]
    for (name, _), reason in zip(BAD_FIELDS, reasons, strict=True):
        assert name in reason or "metadata" in reason, reason
    assert [n.decode() for n in ctx.redis.zrange(ctx.keys.active(ns), 0, -1)] == [good]
    assert client.get(good, namespace=ns).content == "the one good note"


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    content=accepted_texts.filter(str.strip).map(lambda t: t[:2000]), fields=accepted_store_fields
)
def test_whatever_the_producer_accepts_is_organised_and_renders_on_every_read_path(
    ctx, client, server, content: str, fields: dict[str, Any]
) -> None:
    ns = f"accepted-{uuid.uuid4().hex[:8]}"
    try:
        note_id = client.store(f"probe {content}", namespace=ns, **fields)
    except InvalidInput as exc:  # rare: a packed size or tag count over its limit
        assert "limit" in str(exc)
        return
    drain_all(ctx)

    note = client.get(note_id, namespace=ns)
    hits = client.search("probe", namespace=ns, k=3)
    text = client.context("probe", namespace=ns, max_tokens=500)

    assert note_id in {h.id for h in hits} and text.strip()
    out = io.StringIO()
    with redirect_stdout(out):
        Printer(as_json=True).record(note.model_dump())
        Printer(as_json=True).rows([h.model_dump() for h in hits], ["id"], "none")
    assert all(json.loads(line) for line in out.getvalue().splitlines())


@pytest.mark.parametrize("as_json", [True, False])
def test_the_cli_prints_every_accepted_note(ctx, client, as_json: bool) -> None:
    ns = "printable"
    deepest: object = "leaf"
    for _ in range(15):
        deepest = [deepest]
    note_id = client.store(
        "a note with every kind of metadata",
        namespace=ns,
        metadata={"deep": deepest, "n": 2**63 - 1, "f": -0.0, "s": "\u2028<b>"},
        event_time="0001-01-02T00:00:00+00:00",
        agent="agent-\u00e9",
    )
    drain_all(ctx)
    out = io.StringIO()
    with redirect_stdout(out):
        Printer(as_json=as_json).record(client.get(note_id, namespace=ns).model_dump())
    assert note_id in out.getvalue()


BAD_SEARCHES = [
    ("hops", 50_000_000),
    ("k", 10**9),
    ("k", 0),
    ("namespaces", [f"ns{i}" for i in range(500)]),
    ("namespaces", []),
    ("namespaces", ["a", "a"]),
    ("namespaces", ["no spaces allowed"]),
    ("deadline", 1e18),
    ("deadline", math.inf),
    ("query", "q" * 100_000),
    ("diversity", math.nan),
    ("min_relevance", 7.0),
    ("max_tokens", 10**12),
    ("as_of", math.nan),
    ("weights", {"dense": math.inf}),
    ("filters", {"agent": "a" * 100_000}),
]


@pytest.mark.parametrize(("field", "value"), BAD_SEARCHES)
def test_a_search_job_the_producer_would_refuse_is_refused_and_the_thread_goes_on(
    ctx, server, client, field: str, value: Any
) -> None:
    note_id = client.store("the search thread keeps serving", namespace="u")
    drain_all(ctx)
    job = client._core.search_job("search", "u", query="serving", k=3)
    raw = {**job.model_dump(), field: value}
    ctx.redis.lpush(ctx.keys.search_queue_of(["u"]), msgpack.packb(raw, use_bin_type=True))
    reply = ctx.redis.blpop([ctx.keys.reply(job.job_id)], timeout=10)
    assert reply is not None, "no reply: the job occupied or killed the search thread"
    answer = msgpack.unpackb(reply[1])
    assert answer["ok"] is False and answer["error"].startswith("refused: ")
    assert [h.id for h in client.search("serving", namespace="u", k=3)] == [note_id]


def test_an_organise_job_with_a_far_deadline_or_unknown_jobs_is_refused(ctx, client) -> None:
    for field, value in (("deadline", 1e18), ("jobs", ["../../etc"])):
        job = client._core.organise_job("u", wait=True, timeout_s=5, jobs=None)
        forged = job.model_copy(update={field: value})
        reply = organiser.handle(ctx, forged, msgpack.packb(forged.model_dump(), use_bin_type=True))
        assert reply is not None and not reply.ok


def test_searching_namespaces_nobody_wrote_keeps_nothing_of_them(ctx, server, client) -> None:
    client.store("the one namespace with notes", namespace="real")
    drain_all(ctx)
    for i in range(40):
        assert client.search("namespace with notes", namespace=[f"nobody-{i}", "real"], k=3)
    assert set(ctx.projections) == {"real"}
    index_dir = ctx.settings.index_dir
    assert not index_dir.exists() or not list(index_dir.glob("*.lock"))
