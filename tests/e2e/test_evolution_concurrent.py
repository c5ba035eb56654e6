"""Fault injection: evolution applies while a real `zettelq worker` process ingests into the same
namespace — re-stores of the very notes evolution changes, and new notes linking to them.

No update may be lost. Every write of a note (ingest's create/update, evolution's evolve) is
audited in the same MULTI/EXEC as the write itself, with the note's version, so each note's
audit trail must be one unbroken chain: every write starts from the version the previous one
left (a write computed from a stale read would repeat a version), the note's hash holds the last
entry's version and tags, and its content is the last one stored. Links stay two-sided and valid.
"""

from __future__ import annotations

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
    stop = threading.Event()
    errors: list[BaseException] = []

    def evolve_continuously() -> None:
        try:
            while not stop.is_set():
                if not evolve_namespace(ctx, NS):
                    stop.wait(0.02)
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    last_content: dict[str, str] = {}
    try:
        with running(settings, ZQ_SEQUENCE_WEIGHT="0"), MemoryClient(settings) as mem:
            for nid, (text, tags) in seeds().items():
                mem.store(text, namespace=NS, tags=tags, id=nid)
                last_content[nid] = text
            mem.flush(NS, timeout_s=60)
            evolver = threading.Thread(target=evolve_continuously, daemon=True)
            evolver.start()
            for r in range(ROUNDS):
                before = applied(ctx)
                for nid, (text, tags) in seeds().items():
                    content = f"{text} (revision {r})"
                    mem.store(content, namespace=NS, tags=tags, id=nid)
                    last_content[nid] = content
                for topic, texts in TOPICS.items():
                    mem.store(f"{texts[0]} and again in round {r}", namespace=NS, tags=[topic])
                wait_until(lambda before=before: applied(ctx) > before, timeout_s=60)
            mem.flush(NS, timeout_s=60)
            stop.set()
            evolver.join(60)
            assert not errors, errors
            while evolve_namespace(ctx, NS):
                pass

        evolved_after_update = updated_after_evolve = 0
        for nid, content in last_content.items():
            writes = trail(ctx, nid)
            ops = [op for op, _, _ in writes]
            assert ops[0] == "create" and writes[0][2]["version"] == 1, (nid, ops)
            for (_, _, prev), (op, before, after) in zip(writes, writes[1:], strict=False):
                assert after["version"] == prev["version"] + 1, (nid, ops)
                if op == "evolve":
                    assert before["version"] == prev["version"], (nid, ops)
                    assert before["tags"] == prev["tags"], (nid, ops)
            pairs = list(zip(ops, ops[1:], strict=False))
            evolved_after_update += ("update", "evolve") in pairs
            updated_after_evolve += ("evolve", "update") in pairs
            note = mem_note(ctx, nid)
            assert note["version"] == writes[-1][2]["version"]
            assert note["tags"] == writes[-1][2]["tags"]
            assert note["content"] == content
        assert evolved_after_update and updated_after_evolve
        assert check_namespace(ctx, NS) == []
    finally:
        stop.set()
        ctx.close()


def mem_note(ctx: WorkerContext, nid: str) -> dict[str, object]:
    raw = ctx.redis.hmget(ctx.keys.note(NS, nid), ["version", "tags", "content"])
    return {"version": int(raw[0]), "tags": msgpack.unpackb(raw[1]), "content": raw[2].decode()}
