"""Fault injection: evolution applies while a real `zettelq worker` process ingests into the same
namespace — re-stores of the very notes evolution changes, and new notes linking to them.

No update may be lost. Every write of a note (ingest's create/update, evolution's evolve) is
audited in the same MULTI/EXEC as the write itself, with the note's version, so each note's
audit trail must be one unbroken chain: every write starts from the version the previous one
left (a write computed from a stale read would repeat a version), the note's hash holds the last
entry's version and tags, and its content is the last one stored. Links stay two-sided and valid.
"""

from __future__ import annotations

import itertools
import threading

import msgpack
import pytest

from producer import MemoryClient
from tests.e2e.workers import running, wait_until
from worker.context import WorkerContext
from worker.evolution import evolve_namespace
from worker.integrity import check_namespace
from worker.settings import WorkerSettings

pytestmark = pytest.mark.e2e

NS = "evolving"
ROUNDS = 5
#: topic -> notes; the first three carry the topic as a caller tag, the fourth does not (so
#: evolution has a tag to spread to it, again after every re-store resets its tags)
TOPICS = {
    "billing": [
        "Snowflake warehouse credits spike every Monday morning",
        "Snowflake warehouse credits are billed per second of compute",
        "Snowflake warehouse credits for the analytics team are capped monthly",
        "The Snowflake warehouse suspends after five idle minutes to save credits",
    ],
    "oncall": [
        "Kubernetes pods of the ingest service restart when memory runs out",
        "Kubernetes pods of the ingest service page the oncall engineer on restart",
        "Kubernetes pods of the ingest service get a memory limit of two gigabytes",
        "The ingest service pods on Kubernetes drain their queue before a restart",
    ],
}


def seeds() -> dict[str, tuple[str, list[str]]]:
    return {
        f"{topic}-{i}": (text, [topic] if i < 3 else [])
        for topic, texts in TOPICS.items()
        for i, text in enumerate(texts)
    }


def trail(ctx: WorkerContext, nid: str) -> list[tuple[str, dict[str, object], dict[str, object]]]:
    """(op, before, after) of every write of ``nid``, in commit order."""
    return [
        (e[b"op"].decode(), msgpack.unpackb(e[b"before"]), msgpack.unpackb(e[b"after"]))
        for _, e in ctx.redis.xrange(ctx.keys.audit(NS))
        if e[b"id"].decode() == nid and e[b"op"] in (b"create", b"update", b"evolve")
    ]


def applied(ctx: WorkerContext) -> int:
    return int(ctx.redis.hget(ctx.keys.stats(NS), "evolve_applied") or 0)


def test_concurrent_evolution_and_ingest_never_lose_an_update(own_settings: WorkerSettings):
    settings = own_settings.model_copy(update={"evolution": "apply", "sequence_weight": 0.0})
    ctx = WorkerContext.build(settings)
    try:
        with running(settings, ZQ_SEQUENCE_WEIGHT="0"), MemoryClient(settings) as mem:
            last_content = ingest_while_evolving(ctx, mem)
        while evolve_namespace(ctx, NS):
            pass

        orders = [check_trail(ctx, nid, content) for nid, content in last_content.items()]

        assert any(("update", "evolve") in pairs for pairs in orders)  # evolution after ingest
        assert any(("evolve", "update") in pairs for pairs in orders)  # ingest after evolution
        assert check_namespace(ctx, NS) == []
    finally:
        ctx.close()


def ingest_while_evolving(ctx: WorkerContext, mem: MemoryClient) -> dict[str, str]:
    """Seed, then ROUNDS rounds of re-stores and new linked notes while a thread evolves the
    namespace continuously (each round waits for an evolution to land); return each seed id's
    last stored content."""
    last_content: dict[str, str] = {}
    for nid, (text, tags) in seeds().items():
        mem.store(text, namespace=NS, tags=tags, id=nid)
        last_content[nid] = text
    mem.flush(NS, timeout_s=60)
    stop = threading.Event()
    errors: list[BaseException] = []
    evolver = threading.Thread(target=evolve_until, args=(ctx, stop, errors), daemon=True)
    evolver.start()
    try:
        for r in range(ROUNDS):
            before = applied(ctx)
            for nid, (text, tags) in seeds().items():
                last_content[nid] = f"{text} (revision {r})"
                mem.store(last_content[nid], namespace=NS, tags=tags, id=nid)
            for topic, texts in TOPICS.items():
                mem.store(f"{texts[0]} and again in round {r}", namespace=NS, tags=[topic])
            wait_until(lambda before=before: applied(ctx) > before, timeout_s=60)
        mem.flush(NS, timeout_s=60)
    finally:
        stop.set()
        evolver.join(60)
    assert not errors, errors
    return last_content


def evolve_until(ctx: WorkerContext, stop: threading.Event, errors: list[BaseException]) -> None:
    try:
        while not stop.is_set():
            if not evolve_namespace(ctx, NS):
                stop.wait(0.02)
    except BaseException as exc:  # handed to the test thread, which fails on it
        errors.append(exc)


def check_trail(ctx: WorkerContext, nid: str, content: str) -> list[tuple[str, str]]:
    """Assert that the writes of ``nid`` form one unbroken version chain ending in its stored
    state; return the (op, next op) pairs of the chain."""
    writes = trail(ctx, nid)
    ops = [op for op, _, _ in writes]
    assert ops[0] == "create" and writes[0][2]["version"] == 1, (nid, ops)
    for (_, _, prev), (op, before, after) in itertools.pairwise(writes):
        assert after["version"] == prev["version"] + 1, (nid, ops)
        if op == "evolve":
            assert before["version"] == prev["version"], (nid, ops)
            assert before["tags"] == prev["tags"], (nid, ops)
    raw = ctx.redis.hmget(ctx.keys.note(NS, nid), ["version", "tags", "content"])
    assert int(raw[0]) == writes[-1][2]["version"]
    assert msgpack.unpackb(raw[1]) == writes[-1][2]["tags"]
    assert raw[2].decode() == content
    return list(itertools.pairwise(ops))
