"""Consolidation through real Redis, real ingest and a real search server: one insight per
dense cluster, searchable, linked abstracted_from, idempotent, updated when its cluster grows;
with the LLM on, the loopback server's summary, and the extractive one when it answers badly."""

from __future__ import annotations

import time
from collections.abc import Iterator

import msgpack
import pytest

from producer import MemoryClient
from producer.protocol import unpack_link
from tests.conftest import drain_all, make_settings
from tests.integration.chat_server import ChatServer, answer, chat
from worker.context import WorkerContext
from worker.organise.consolidation import consolidate_namespace
from worker.organise.periodic import last_runs, run_periodic
from worker.runtime.organiser import organise
from worker.runtime.servers import SearchServer
from worker.store.integrity import check_namespace

__all__ = ["chat"]

SOLAR = [
    "Postgres stores the solar panel readings every minute.",
    "Solar panel readings arrive from the inverters over MQTT.",
    "The inverters push solar panel readings to Postgres through MQTT.",
]
OTHER = ["Lunch on Friday is pizza.", "The office plants need water on Mondays."]
STORE_WAS = "The solar panel readings store is Postgres, fed by the inverters over MQTT."
STORE_MOVED = "The solar panel readings store moved from Postgres to TimescaleDB."
GROWTH = "Solar panel readings from the inverters land in Postgres over MQTT each minute."


def build(tmp_path, **overrides) -> WorkerContext:
    return WorkerContext.build(make_settings(tmp_path, consolidate_min_weight=0.2, **overrides))


@pytest.fixture
def octx(redis_db, tmp_path) -> Iterator[WorkerContext]:
    ctx = build(tmp_path)
    yield ctx
    ctx.close()


def insights(ctx, ns) -> dict[str, tuple[str, ...]]:
    raw = ctx.redis.hgetall(ctx.keys.clusters(ns))
    return {k.decode(): tuple(msgpack.unpackb(v)) for k, v in raw.items()}


def ops(ctx, ns) -> list[tuple[bytes, bytes]]:
    return [(e[b"op"], e[b"id"]) for _, e in ctx.redis.xrange(ctx.keys.audit(ns))]


def seed(ctx, mem: MemoryClient, ns="c") -> list[str]:
    """The SOLAR ids first, then the OTHER ones. Stored interleaved, so that consecutive notes
    are unrelated and no link between two SOLAR notes is a sequence link."""
    order = [SOLAR[0], OTHER[0], SOLAR[1], OTHER[1], SOLAR[2]]
    ids = dict(zip(order, mem.store_many(order, namespace=ns), strict=True))
    drain_all(ctx)
    return [ids[text] for text in SOLAR + OTHER]


def test_a_cluster_gets_one_searchable_insight_linked_to_its_members(octx):
    srv = SearchServer(octx).start()
    try:
        with MemoryClient(octx.settings) as mem:
            ids = seed(octx, mem)

            assert consolidate_namespace(octx, "c") == 1

            ((iid, members),) = insights(octx, "c").items()
            assert set(members) == set(ids[:3])
            note = mem.get(iid, namespace="c")
            assert note.kind == "insight" and "insight" in note.tags
            assert set(note.links) == set(members)
            assert note.content.startswith(tuple(s.split(".")[0] for s in SOLAR))
            packed = octx.redis.hgetall(octx.keys.links("c", iid))
            for member in members:
                link = unpack_link(packed[member.encode()])[1]
                assert (link["reason"], link["source"]) == ("abstracted_from", "consolidation")
            hits = mem.search("solar panel readings inverters", namespace="c", k=10)
            assert any(h.id == iid and h.kind == "insight" for h in hits)
            stats = mem.stats("c")
            assert "consolidate" in stats.last
        assert (b"create", iid.encode()) in ops(octx, "c")
        assert check_namespace(octx, "c") == []
    finally:
        srv.stop()


def test_consolidation_is_idempotent_and_skips_unchanged_namespaces(octx):
    with MemoryClient(octx.settings) as mem:
        seed(octx, mem)
    assert run_periodic(octx, "consolidate") == 1
    audit_len = octx.redis.xlen(octx.keys.audit("c"))
    active = octx.redis.zcard(octx.keys.active("c"))

    assert consolidate_namespace(octx, "c") == 0
    assert run_periodic(octx, "consolidate") == 0  # looks once more: its insight was added
    assert run_periodic(octx, "consolidate") == 0
    assert last_runs(octx)["consolidate"].namespaces == 0  # unchanged since: skipped

    assert octx.redis.xlen(octx.keys.audit("c")) == audit_len
    assert octx.redis.zcard(octx.keys.active("c")) == active


def test_a_grown_cluster_updates_its_insight(octx):
    with MemoryClient(octx.settings) as mem:
        ids = seed(octx, mem)
        consolidate_namespace(octx, "c")
        ((iid, _),) = insights(octx, "c").items()
        new = mem.store(GROWTH, namespace="c")
        drain_all(octx)

        assert run_periodic(octx, "consolidate") == 1

        assert insights(octx, "c") == {iid: tuple(sorted([*ids[:3], new]))}
        note = mem.get(iid, namespace="c")
        assert note.version == 2 and new in note.links
    assert ops(octx, "c")[-1] == (b"update", iid.encode())
    assert int(octx.redis.hget(octx.keys.stats("c"), "insights")) == 1
    assert check_namespace(octx, "c") == []


def test_a_deleted_insight_is_not_recreated(octx):
    with MemoryClient(octx.settings) as mem:
        seed(octx, mem)
        consolidate_namespace(octx, "c")
        ((iid, _),) = insights(octx, "c").items()
        mem.delete(iid, namespace="c")
        mem.store(GROWTH, namespace="c")
        drain_all(octx)

    assert consolidate_namespace(octx, "c") == 0
    assert octx.redis.hget(octx.keys.note("c", iid), "status") == b"tombstoned"


def test_with_the_llm_on_the_insight_is_the_models_summary(redis_db, tmp_path, chat: ChatServer):
    ctx = build(tmp_path, llm_url=chat.url)
    summary = "Solar readings flow from the inverters over MQTT into Postgres every minute."
    chat.reply_with(answer({"summary": summary, "sources": [1, 2, 3]}))
    try:
        with MemoryClient(ctx.settings) as mem:
            seed(ctx, mem)
            assert consolidate_namespace(ctx, "c") == 1
            ((iid, _),) = insights(ctx, "c").items()
            note = mem.get(iid, namespace="c")
        assert note.content == summary
        assert note.metadata["summary"] == f"model:{ctx.settings.llm_model}"
        (request,) = chat.requests
        assert "[3] " in request["messages"][1]["content"]
        assert "[4] " not in request["messages"][1]["content"]
    finally:
        ctx.close()


def test_an_llm_answer_citing_unknown_notes_falls_back_to_the_extractive_summary(
    redis_db, tmp_path, chat: ChatServer
):
    ctx = build(tmp_path, llm_url=chat.url)
    chat.reply_with(answer({"summary": "Made up.", "sources": [7]}))
    try:
        with MemoryClient(ctx.settings) as mem:
            seed(ctx, mem)
            assert consolidate_namespace(ctx, "c") == 1
            ((iid, _),) = insights(ctx, "c").items()
            note = mem.get(iid, namespace="c")
        assert note.content != "Made up." and note.metadata["summary"] == "extractive"
        assert int(ctx.redis.hget(ctx.keys.stats("c"), "llm_fail_unknown_id")) == 1
    finally:
        ctx.close()


def test_a_superseded_note_joins_only_its_successors_cluster_and_stays_out_of_its_text(octx):
    with MemoryClient(octx.settings) as mem:
        ids = seed(octx, mem)
        old = mem.store(STORE_WAS, namespace="c")
        drain_all(octx)
        new = mem.store(STORE_MOVED, namespace="c")
        drain_all(octx)
        assert mem.get(old, namespace="c").superseded_by == new

        assert consolidate_namespace(octx, "c") == 1

        ((iid, members),) = insights(octx, "c").items()
        assert set(ids[:3]) <= set(members) and (old in members) == (new in members)
        assert STORE_WAS.split(",")[0] not in mem.get(iid, namespace="c").content
    assert check_namespace(octx, "c") == []


APOLLO = [
    "The project 'Apollo' aims to build a dashboard for tracking solar panel efficiency.",
    "We chose React for the frontend because the team knows it well.",
    "The backend must be Python to support the data science libraries.",
    "Client called. They are unhappy with React performance on low-end devices.",
    "We are switching the frontend to Svelte for better performance.",
]


def test_the_seed_story_gets_an_insight_over_the_change_from_react_to_svelte(redis_db, tmp_path):
    ctx = WorkerContext.build(make_settings(tmp_path))  # the default consolidation settings
    try:
        with MemoryClient(ctx.settings) as mem:
            ids = [mem.store(event, namespace="apollo", agent="pm") for event in APOLLO]
            drain_all(ctx)
            react, unhappy, svelte = ids[1], ids[3], ids[4]

            assert organise(ctx, "apollo", ["consolidate"], time.time() + 60)[0].work == 1

            ((iid, members),) = insights(ctx, "apollo").items()
            assert set(members) == {react, unhappy, svelte}
            content = mem.get(iid, namespace="apollo").content
            assert APOLLO[4] in content and APOLLO[1] not in content  # what holds now
            assert mem.get(react, namespace="apollo").superseded_by == svelte
        assert check_namespace(ctx, "apollo") == []
    finally:
        ctx.close()


def test_reconsolidating_a_growing_cluster_counts_each_link_once(octx):
    with MemoryClient(octx.settings) as mem:
        seed(octx, mem)
        consolidate_namespace(octx, "c")
        for n in range(3):  # each new member is linked to the insight by ingest already
            mem.store(f"{GROWTH} Reading batch {n}.", namespace="c")
            drain_all(octx)

            assert consolidate_namespace(octx, "c") == 1

            active = [m.decode() for m in octx.redis.zrange(octx.keys.active("c"), 0, -1)]
            stored = sum(octx.redis.hlen(octx.keys.links("c", nid)) for nid in active) // 2
            assert mem.stats("c").links == stored
    assert check_namespace(octx, "c") == []
