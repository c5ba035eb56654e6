"""organise(): every periodic job run now for one namespace by a real organise server (the
worker's code, in a thread) against real Redis, with its summary; timeouts, failures, bad
input and concurrent ingest."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from producer import AsyncMemoryClient, InvalidInput, JobFailed, MemoryClient, ReplyTimeout
from tests.conftest import drain_all, make_settings
from tests.e2e.workers import wait_until
from tests.integration.test_consolidation import OTHER, SOLAR
from worker.context import WorkerContext
from worker.organise.periodic import JOBS
from worker.runtime.organiser import OrganiseServer
from worker.settings import WorkerSettings
from worker.store.integrity import check_namespace


@pytest.fixture
def osettings(redis_db, tmp_path) -> WorkerSettings:
    return make_settings(tmp_path, consolidate_min_weight=0.2, max_notes=4)


@pytest.fixture
def octx(osettings) -> Iterator[WorkerContext]:
    ctx = WorkerContext.build(osettings)
    yield ctx
    ctx.close()


@pytest.fixture
def organiser(octx) -> Iterator[OrganiseServer]:
    srv = OrganiseServer(octx).start()
    yield srv
    srv.stop()


@pytest.fixture
def mem(osettings) -> Iterator[MemoryClient]:
    with MemoryClient(osettings) as client:
        yield client


def store_cluster(mem: MemoryClient, ns: str) -> list[str]:
    """Three linked SOLAR notes and two loners, interleaved (as in test_consolidation)."""
    return mem.store_many([SOLAR[0], OTHER[0], SOLAR[1], OTHER[1], SOLAR[2]], namespace=ns)


def auto_scored(ctx: WorkerContext, ns: str) -> int:
    """Active notes whose importance the importance job wrote."""
    active = [m.decode() for m in ctx.redis.zrange(ctx.keys.active(ns), 0, -1)]
    fields = [ctx.redis.hget(ctx.keys.note(ns, nid), "importance_auto") for nid in active]
    return sum(f is not None for f in fields)


def test_organise_organises_the_queue_then_runs_every_job_and_reports_its_work(
    octx, organiser, mem
):
    ids = store_cluster(mem, "org")  # queued only: organise drains them first

    done = mem.organise("org")

    assert done.done and done.namespace == "org"
    assert [r.job for r in done.runs] == list(JOBS)
    assert done.work["consolidate"] == 1  # one insight for the SOLAR cluster
    assert done.work["evict"] == 2  # 5 notes + 1 insight, capped at 4
    assert 0 < done.work["importance"] <= 6
    stats = mem.stats("org")
    assert stats.notes == 4 and stats.tombstoned == 2 and stats.pending == 0
    assert auto_scored(octx, "org") >= 2  # the survivors kept the importance written to them
    for run in done.runs:
        assert stats.jobs[run.job] == run
        assert run.at > 0 and run.seconds >= 0
    assert set(ids) & set(m.decode() for m in octx.redis.zrange(octx.keys.tombstoned("org"), 0, -1))
    assert check_namespace(octx, "org") == []


def test_organise_runs_only_the_jobs_named_in_registry_order(organiser, mem):
    store_cluster(mem, "some")

    done = mem.organise("some", jobs=["evict", "consolidate"])

    assert [r.job for r in done.runs] == ["consolidate", "evict"]
    assert done.work == {"consolidate": 1, "evict": 2}
    assert set(mem.stats("some").jobs) == {"consolidate", "evict"}


def test_organising_twice_does_the_work_once(organiser, mem):
    store_cluster(mem, "twice")
    first = mem.organise("twice", jobs=["consolidate"])

    second = mem.organise("twice", jobs=["consolidate"])

    assert (first.work["consolidate"], second.work["consolidate"]) == (1, 0)


def test_organise_without_a_worker_raises_reply_timeout(mem):
    mem.store("nobody organises this", namespace="idle")

    with pytest.raises(ReplyTimeout):
        mem.organise("idle", timeout_s=0.3)


def test_organise_without_waiting_returns_at_once_and_a_worker_runs_it_later(octx, mem):
    store_cluster(mem, "later")

    queued = mem.organise("later", wait=False)

    assert not queued.done and queued.runs == []
    srv = OrganiseServer(octx).start()
    try:
        wait_until(lambda: set(mem.stats("later").jobs) == set(JOBS))
    finally:
        srv.stop()
    assert mem.stats("later").notes == 4
    assert not octx.redis.exists(octx.keys.reply(queued.job_id))  # nobody waits: no reply


def test_an_unknown_job_fails_without_running_anything(organiser, mem):
    store_cluster(mem, "unknown")

    with pytest.raises(JobFailed, match="unknown jobs \\['sleep'\\]"):
        mem.organise("unknown", jobs=["importance", "sleep"])

    assert mem.stats("unknown").jobs == {}


def test_a_job_that_raises_fails_the_call_with_its_name(octx, organiser, mem):
    store_cluster(mem, "broken")
    drain_all(octx)
    octx.redis.hset(octx.keys.clusters("broken"), "insight-x", b"\xc1")  # undecodable entry

    with pytest.raises(JobFailed, match="job consolidate failed on broken"):
        mem.organise("broken")

    assert "consolidate" not in mem.stats("broken").jobs
    assert mem.organise("broken", jobs=["importance"]).work["importance"] > 0  # server lives


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"jobs": "importance"}, "list of 1 to 32 job names"),
        ({"jobs": []}, "list of 1 to 32 job names"),
        ({"jobs": ["Importance"]}, "job names are"),
        ({"jobs": ["evict", "evict"]}, "same job twice"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": 301}, "timeout_s"),
    ],
)
def test_bad_arguments_raise_invalid_input_and_queue_nothing(mem, kwargs, message):
    with pytest.raises(InvalidInput, match=message):
        mem.organise("bad", **kwargs)

    assert mem._redis.llen(mem.keys.organise_queue()) == 0


def test_a_bad_namespace_raises_invalid_input(mem):
    with pytest.raises(InvalidInput, match="namespace"):
        mem.organise("a{b}")


def test_an_unsigned_organise_is_refused_when_signatures_are_required(redis_db, tmp_path):
    worker = make_settings(tmp_path, require_signatures=True, namespace_keys={"sig": "k1"})
    producer = make_settings(tmp_path, key_prefix=worker.key_prefix)
    ctx = WorkerContext.build(worker)
    srv = OrganiseServer(ctx).start()
    try:
        with MemoryClient(producer) as unsigned, pytest.raises(JobFailed, match="refused"):
            unsigned.organise("sig")
        with MemoryClient(worker) as signed:
            assert signed.organise("sig").done
    finally:
        srv.stop()
        ctx.close()


def test_async_organise_returns_the_same_summary(organiser, osettings):
    async def scenario() -> None:
        async with AsyncMemoryClient(osettings) as amem:
            await amem.store_many([SOLAR[0], OTHER[0], SOLAR[1], OTHER[1], SOLAR[2]], namespace="a")
            done = await amem.organise("a")
            assert [r.job for r in done.runs] == list(JOBS)
            assert done.work["consolidate"] == 1
            queued = await amem.organise("a", wait=False)
            assert not queued.done
            with pytest.raises(JobFailed):
                await amem.organise("a", jobs=["nope"])

    asyncio.run(scenario())


def test_organise_while_ingest_runs_never_loses_a_note(redis_db, tmp_path):
    settings = make_settings(tmp_path, consolidate_min_weight=0.2)
    ingest_ctx, organise_ctx = WorkerContext.build(settings), WorkerContext.build(settings)
    srv = OrganiseServer(organise_ctx).start()
    stop = threading.Event()

    def ingest() -> None:  # another worker draining the shards while organise runs
        while not stop.is_set():
            if drain_all(ingest_ctx) == 0:
                stop.wait(0.005)

    ingester = threading.Thread(target=ingest)
    ingester.start()
    ids: list[str] = []
    try:
        with MemoryClient(settings) as mem:
            for r in range(8):
                texts = [f"{t} Round {r} note {i}." for i, t in enumerate(SOLAR + OTHER)]
                ids += mem.store_many(texts, namespace="live")
                done = mem.organise("live")
                assert [run.job for run in done.runs] == list(JOBS)
            stop.set()
            ingester.join()
            drain_all(ingest_ctx)
            for nid in ids:
                assert mem.get(nid, namespace="live").id == nid
            stats = mem.stats("live")
            insights = organise_ctx.redis.hlen(organise_ctx.keys.clusters("live"))
            assert insights > 0 and stats.notes == len(ids) + insights
        assert check_namespace(organise_ctx, "live") == []
    finally:
        stop.set()
        ingester.join()
        srv.stop()
        ingest_ctx.close()
        organise_ctx.close()
