"""A search thread queues its next search's first reads behind the BRPOP that takes the job
(worker/search/retrieve.py, ``Lookahead``): Redis runs them as it hands the job over, so they
see every write made before the job was pushed (a store made while the thread waits is found by
a fresh search), and a search of a quiet namespace whose rows are kept then needs no round trip
of its own before its reply."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from redis import Redis

from producer import MemoryClient
from producer.core import ClientCore
from producer.protocol import SearchJob, pack
from tests.conftest import drain_all
from tests.integration.test_search_rows import trips
from worker.context import WorkerContext
from worker.runtime.servers import take
from worker.search import retrieve

NOTES = [
    "The billing service retries failed card payments three times.",
    "Card payments above the limit need a second approval.",
    "The deploy pipeline runs the billing tests before every release.",
]
LATE = "A lighthouse keeper logs the fog horn schedule every evening."


def searched(ctx: WorkerContext, client: MemoryClient, ns: str) -> tuple[ClientCore, Any]:
    """The namespace stored, organised and searched once by ``ctx`` (its projection held,
    settled, its rows kept), and a Lookahead that remembers that search."""
    client.store_many(NOTES, namespace=ns)
    drain_all(ctx)
    core = ClientCore(ctx.settings)
    lookahead = retrieve.Lookahead(ctx)
    for _ in range(2):  # the second search finds the projection settled and keeps its rows
        job = core.search_job("search", ns, query="card payments", k=3, timeout_s=5.0)
        assert retrieve.handle(ctx, job) is not None
    lookahead.remember(job)
    return core, lookahead


def taken(
    ctx: WorkerContext,
    lookahead: retrieve.Lookahead,
    job: SearchJob,
    meanwhile: Callable[[], object] = lambda: None,
) -> tuple[Any, retrieve.Probe | None]:
    """What ``take`` returns for ``job``: a thread blocks in it on the job's list (waited for:
    its BRPOP is blocked in Redis), ``meanwhile`` runs, then the job is pushed."""
    queue = ctx.keys.search_queue_of(job.namespaces)
    conn = Redis.from_url(ctx.settings.redis_url)
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(take(conn, [queue], 10, lookahead)))
    thread.start()
    try:
        deadline = time.monotonic() + 5
        while not any(c["cmd"] == "brpop" for c in ctx.redis.client_list() if "b" in c["flags"]):
            assert time.monotonic() < deadline, "the thread never blocked in BRPOP"
            time.sleep(0.01)
        meanwhile()
        ctx.redis.lpush(queue, pack(job))
    finally:
        thread.join(15)
        conn.close()
    assert out, "take returned nothing"
    return out[0]


def test_a_store_made_while_the_thread_waits_is_found_by_a_fresh_search(ctx, client):
    """The reads queued behind the BRPOP run after the job came: the store made before it is
    in the inbox they read, so the search waits for it (drains it, as no worker holds the
    shard) and finds it. Reads made when they were queued would have seen an empty inbox."""
    core, lookahead = searched(ctx, client, "late")
    job = core.search_job("search", "late", query="lighthouse fog horn", k=1, timeout_s=5.0)
    got, ahead = taken(ctx, lookahead, job, lambda: client.store(LATE, namespace="late"))
    assert got is not None and ahead is not None
    reply = retrieve.handle(ctx, job, ahead)
    assert reply is not None and reply.ok
    assert [h.content for h in reply.hits] == [LATE]


def test_a_quiet_namespace_is_searched_without_a_round_trip(ctx, client):
    core, lookahead = searched(ctx, client, "quiet")
    job = core.search_job("search", "quiet", query="card payments", k=3, timeout_s=5.0)
    _, ahead = taken(ctx, lookahead, job)
    assert ahead is not None
    with trips() as sent:
        reply = retrieve.handle(ctx, job, ahead)
    assert sent == []  # the freshness check, change log and counters came with the job
    again = retrieve.handle(ctx, job)
    assert reply is not None and again is not None
    assert [h.id for h in reply.hits] == [h.id for h in again.hits]


def test_reads_of_a_projection_that_moved_since_are_made_again(ctx, client):
    """Notes organised by this process after the reads were queued move its projection past
    the position they read from: the search reads afresh, and finds the new note."""
    core, lookahead = searched(ctx, client, "moved")
    job = core.search_job("search", "moved", query="lighthouse fog horn", k=1, timeout_s=5.0)
    _, ahead = taken(ctx, lookahead, job)
    assert ahead is not None
    client.store(LATE, namespace="moved")
    drain_all(ctx)
    assert not ahead.fits(["moved"], {"moved": ctx.projection("moved").position})
    with trips() as sent:
        reply = retrieve.handle(ctx, job, ahead)
    assert sent  # its own reads
    assert reply is not None and [h.content for h in reply.hits] == [LATE]


def test_other_namespaces_are_not_served_from_the_reads(ctx, client):
    core, lookahead = searched(ctx, client, "first")
    client.store(LATE, namespace="second")
    drain_all(ctx)
    job = core.search_job("search", ["second"], query="lighthouse", k=1, timeout_s=5.0)
    _, ahead = taken(ctx, lookahead, job)
    assert ahead is not None and ahead.namespaces == ["first"]
    reply = retrieve.handle(ctx, job, ahead)
    assert reply is not None and [h.content for h in reply.hits] == [LATE]


def test_a_failed_read_leaves_the_job_to_the_search(ctx, client):
    """A change log planted as a string makes its read fail: the job is still taken, and the
    search meets the error on its own reads (where the server handles it, as before)."""
    core, lookahead = searched(ctx, client, "planted")

    def plant() -> None:
        ctx.redis.delete(ctx.keys.changes("planted"))
        ctx.redis.set(ctx.keys.changes("planted"), "not a stream")

    job = core.search_job("search", "planted", query="card payments", k=3, timeout_s=5.0)
    got, ahead = taken(ctx, lookahead, job, plant)
    assert got is not None and got[1] == pack(job) and ahead is None


def test_a_thread_with_no_search_yet_only_waits_for_a_job(ctx, client):
    core, _ = searched(ctx, client, "none")
    job = core.search_job("search", "none", query="card payments", k=3, timeout_s=5.0)
    got, ahead = taken(ctx, retrieve.Lookahead(ctx), job)
    assert got is not None and ahead is None


def test_a_server_finds_what_was_stored_between_two_searches(ctx, server, client):
    """Through the search server: each search sees the store made just before it."""
    client.store_many(NOTES, namespace="served")
    for i in range(5):
        client.store(f"{LATE} Entry {i} of the log.", namespace="served")
        hits = client.search("lighthouse fog horn log", namespace="served", k=10, timeout_s=10)
        assert sum("lighthouse" in h.content for h in hits) == i + 1
