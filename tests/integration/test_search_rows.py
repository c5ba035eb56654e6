"""A search process keeps what it read of a namespace's notes while the namespace's version
holds (worker/index/rows.py): a quiet namespace is searched without reading its notes, and after
any change a search ranks exactly as one that reads everything from Redis."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import chain

import pytest
from redis.connection import Connection

from producer.core import ClientCore
from producer.protocol import Hit, Reply, unpack
from tests.conftest import drain_all
from worker.bulk import BulkPipeline
from worker.context import WorkerContext
from worker.index.rows import Pinned
from worker.organise.importance import importance_namespace
from worker.runtime.servers import answer
from worker.search import retrieve
from worker.search.candidates import Cand, load_hit_fields

DAY = 86_400.0
T0 = 1_767_225_600.0  #: 2026-01-01 UTC
NOTES = [
    "The project 'Apollo' builds a dashboard for tracking solar panel efficiency.",
    "We chose React for the frontend because the team knows it well.",
    "The backend must be Python to support the data science libraries.",
    "Client called. They are unhappy with React performance on low-end devices.",
    "The dashboard shows solar panel output per day and per panel.",
    "Panel efficiency drops in summer heat; the dashboard should flag it.",
]
QUERIES = ["solar panel dashboard", "frontend React", "Python backend", "panel efficiency heat"]


@pytest.fixture
def uncached(settings) -> Iterator[WorkerContext]:
    """Another search process of the same store whose searches read every row from Redis."""
    other = WorkerContext.build(settings.model_copy(update={"search_cache": False}))
    yield other
    other.close()


def answers(ctx: WorkerContext, core: ClientCore, ns: str, **options: object) -> list[list[Hit]]:
    out = []
    for query in QUERIES:
        job = core.search_job("search", ns, query=query, k=4, timeout_s=5.0, **options)
        reply = retrieve.handle(ctx, job)
        assert reply is not None and reply.ok, reply
        out.append(reply.hits)
    return out


def same(cached: list[list[Hit]], fresh: list[list[Hit]]) -> None:
    """The same hits in the same order with the same fields; scores to 4 digits (the recency
    of two searches a few milliseconds apart differs in its 9th)."""
    assert [[h.id for h in hits] for hits in cached] == [[h.id for h in hits] for hits in fresh]
    for a, b in zip(chain(*cached), chain(*fresh), strict=True):
        rest = {"score", "recency", "relevance"}
        assert a.model_dump(exclude=rest) == b.model_dump(exclude=rest)
        assert a.score == pytest.approx(b.score, rel=1e-4)


@contextmanager
def trips() -> Iterator[list[int]]:
    """Count the round trips (commands or pipelines sent) made inside."""
    sent: list[int] = []
    real = Connection.send_packed_command

    def count(conn, command, *a, **k):
        sent.append(1)
        return real(conn, command, *a, **k)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Connection, "send_packed_command", count)
        yield sent


def test_a_quiet_namespace_is_searched_without_reading_its_notes(ctx, client, uncached):
    client.store_many(NOTES, namespace="q")
    drain_all(ctx)
    core = ClientCore(ctx.settings)
    answers(ctx, core, "q")  # settles the projection and fills its rows
    answers(uncached, core, "q")
    with trips() as kept:
        cached = answers(ctx, core, "q")
    with trips() as read:
        fresh = answers(uncached, core, "q")
    same(cached, fresh)
    assert len(kept) == len(QUERIES)  # the freshness check, change log, counters: one trip
    assert len(read) == 2 * len(QUERIES)  # that with the candidates, then the hits


def test_kept_rows_rank_as_a_fresh_read_after_each_kind_of_change(ctx, client, uncached):
    core = ClientCore(ctx.settings)
    ids = client.store_many(
        [{"content": text, "event_time": T0 + i * DAY} for i, text in enumerate(NOTES)],
        namespace="c",
    )
    drain_all(ctx)
    since = {"filters": {"since": T0 + 2 * DAY}}

    def check() -> None:
        for options in ({}, {"hops": 2}, {"fresh": False}, {"diversity": 0.5}, since):
            same(answers(ctx, core, "c", **options), answers(uncached, core, "c", **options))

    check()
    client.store(  # links to the notes kept, and supersedes the React choice
        "We are switching the frontend from React to Svelte for performance.",
        namespace="c",
        event_time=T0 + 9 * DAY,
    )
    drain_all(uncached)  # another process organises: this one only sees the version move
    check()
    assert importance_namespace(uncached, "c") > 0
    check()
    client.store(NOTES[0] + " It is due in March.", namespace="c", id=ids[0])
    drain_all(uncached)
    check()
    client.delete(ids[4], namespace="c")
    drain_all(uncached)
    check()


def age(ctx: WorkerContext, ns: str, ids: list[str], days: float) -> None:
    """Make the notes ``days`` old (as stored long ago), and say so to search processes."""
    pipe = ctx.redis.pipeline(transaction=False)
    for nid in ids:
        pipe.hset(ctx.keys.note(ns, nid), "created_at", time.time() - days * DAY)
    pipe.incr(ctx.keys.version(ns))
    pipe.execute()


def reinforce(ctx: WorkerContext, hits: list[Hit], now: float) -> None:
    """What a search server does with its reply: reinforce the hits and count it."""
    pipe = BulkPipeline(ctx.redis)
    counted = retrieve.touch(ctx, pipe, hits, now)
    counted(pipe.execute())


def searched_old_notes(ctx: WorkerContext, client, ns: str) -> tuple[ClientCore, list[list[Hit]]]:
    """The notes stored 90 days ago in ``ns``, organised, and searched once by ``ctx``."""
    ids = client.store_many(NOTES, namespace=ns)
    drain_all(ctx)
    age(ctx, ns, ids, 90)
    core = ClientCore(ctx.settings)
    return core, answers(ctx, core, ns)


def test_a_search_that_reinforces_keeps_its_rows_current(ctx, client, uncached):
    core, before = searched_old_notes(ctx, client, "r")
    reinforce(ctx, before[1][:2], time.time())
    with trips() as sent:
        after = answers(ctx, core, "r")
    assert len(sent) == len(QUERIES)  # still kept
    same(after, answers(uncached, core, "r"))
    assert after != before


def test_another_process_reinforcement_shows_in_the_next_search(ctx, client, uncached):
    core, before = searched_old_notes(ctx, client, "o")
    reinforce(uncached, before[1][:2], time.time())  # another process's search
    after = answers(ctx, core, "o")
    same(after, answers(uncached, core, "o"))
    assert after != before
    reinforce(ctx, after[2][:1], time.time())  # this one's, after the other's
    same(answers(ctx, core, "o"), answers(uncached, core, "o"))


def test_a_planted_reinforcement_count_only_turns_the_cache_off(ctx, client, uncached):
    """A count that holds no integer: every search reads its rows, and a reinforcing reply
    still reaches its caller and leaves the search thread serving."""
    client.store_many(NOTES, namespace="p")
    drain_all(ctx)
    ctx.redis.set(ctx.keys.touches("p"), "not a count")
    core = ClientCore(ctx.settings)
    answers(ctx, core, "p")
    with trips() as sent:
        cached = answers(ctx, core, "p")
    assert len(sent) == 3 * len(QUERIES)  # counters, candidates once more, hits: nothing kept
    same(cached, answers(uncached, core, "p"))
    job = core.search_job("search", "p", query="solar panel", k=2, timeout_s=5.0)
    reply = retrieve.handle(ctx, job)
    assert reply is not None
    answer(ctx, job, reply)  # its INCR fails on the planted value; nothing raises
    assert ctx.redis.lpop(ctx.keys.reply(job.job_id)) is not None


def test_one_id_in_two_namespaces_keeps_two_rows(ctx, client):
    """Ids are the caller's to give, so one id can name a note in each of two namespaces: a
    search over both returns each with its own fields, read or kept."""
    nid = client.store("The solar panel dashboard is green.", namespace="m1")
    client.store("The solar panel dashboard is red.", namespace="m2", id=nid)
    drain_all(ctx)
    core = ClientCore(ctx.settings)
    for _ in range(2):
        job = core.search_job("search", ["m1", "m2"], query="solar dashboard", k=4, timeout_s=5)
        reply = retrieve.handle(ctx, job)
        assert reply is not None and reply.ok
        got = {(h.namespace, h.id): h.content for h in reply.hits}
        assert got == {
            ("m1", nid): "The solar panel dashboard is green.",
            ("m2", nid): "The solar panel dashboard is red.",
        }


def test_hit_fields_kept_for_a_note_fill_it_in_without_a_read(ctx, client):
    client.store_many(NOTES, namespace="h")
    drain_all(ctx)
    core = ClientCore(ctx.settings)
    hit = answers(ctx, core, "h")[0][0]
    proj = ctx.projection("h")
    cand = Cand(hit.id, "h", 0, {})
    rows = {"h": Pinned(proj.rows, proj.rows.current())}
    with trips() as sent:
        load_hit_fields(ctx, rows, [cand], ctx.embedder.embed(["x"]), ctx.embedder.name)
    assert cand.fields["content"] == hit.content and cand.vec is not None
    assert cand.links == hit.links
    assert sent == []  # its hit fields and links were both kept


def test_a_reply_sent_from_kept_hits_decodes_as_the_hits(ctx, client):
    """The second search's hits are copies of the first's, with their fields as packed for the
    first reply (worker/search/replies.py): both replies arrive as the hits themselves."""
    client.store_many(NOTES, namespace="w")
    drain_all(ctx)
    core = ClientCore(ctx.settings)
    sent = []
    for _ in range(2):
        job = core.search_job("search", "w", query="solar panel dashboard", k=4, timeout_s=5.0)
        reply = retrieve.handle(ctx, job)
        assert reply is not None and reply.ok and reply.hits
        answer(ctx, job, reply)
        raw = ctx.redis.lpop(ctx.keys.reply(job.job_id))
        assert isinstance(raw, bytes)
        assert unpack(Reply, raw).hits == [Hit(**h.model_dump()) for h in reply.hits]
        sent.append(reply.hits)
    first, again = sent
    assert [h.id for h in again] == [h.id for h in first]
    for a, b in zip(first, again, strict=True):
        assert a is not b and a.__pydantic_private__["_rest"] is b.__pydantic_private__["_rest"]
