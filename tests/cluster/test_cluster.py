"""zettelq on a real 3-master Redis Cluster (tests/cluster/conftest.py): the real worker code
(drains, search and organise servers, periodic jobs) and the real clients, sync and async, with
the data store on the cluster and nothing else. Namespaces are chosen to land on different
nodes, so a command that crossed slots would fail with CROSSSLOT; a slot is moved between
nodes while stores flow into it, and nothing is lost or applied twice."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from producer import AsyncMemoryClient, MemoryClient, NotFound
from producer.keys import Keys
from tests.conftest import make_settings, session_redis_url
from tests.integration.test_consolidation import OTHER, SOLAR
from tests.integration.test_store_search import SEED_000
from worker.context import WorkerContext
from worker.errors import TRANSIENT
from worker.intake.dispatch import Dispatcher
from worker.intake.drain import drain_shard
from worker.organise.periodic import JOBS, run_periodic
from worker.runtime.devserver import ThrowawayCluster as LocalCluster
from worker.runtime.organiser import OrganiseServer
from worker.runtime.servers import SearchServer
from worker.settings import WorkerSettings
from worker.store.integrity import check_namespace


@pytest.fixture
def mem(cluster_settings: WorkerSettings) -> Iterator[MemoryClient]:
    with MemoryClient(cluster_settings) as client:
        yield client


def drain(ctx: WorkerContext) -> int:
    """Drain every shard until none holds work, riding a slot that moves (a drain that meets a
    moving slot raises a TRANSIENT error and is run again, as its Celery task would be)."""
    done, deadline = 0, time.monotonic() + 60
    while time.monotonic() < deadline:
        busy = False
        for shard in range(ctx.keys.shard_count):
            try:
                result = drain_shard(ctx, shard)
            except TRANSIENT:
                busy = True
                time.sleep(0.01)
                continue
            done += result.processed
            busy |= result.more
        if not busy:
            return done
    raise AssertionError("the shards never emptied")


def node_port(cluster: LocalCluster, key: str) -> int:
    slot = int(cluster.node(cluster.ports[0]).execute_command("CLUSTER", "KEYSLOT", key))
    for start, end, (_, port, *_), *_ in cluster.node(cluster.ports[0]).execute_command(
        "CLUSTER", "SLOTS"
    ):
        if start <= slot <= end:
            return int(port)
    raise AssertionError(f"slot {slot} is not served")


def spread(cluster: LocalCluster, keys: Keys, count: int) -> list[str]:
    """``count`` namespaces whose keys live on ``count`` different nodes."""
    found: dict[int, str] = {}
    for i in range(1000):
        ns = f"ns{i}"
        found.setdefault(node_port(cluster, keys.active(ns)), ns)
        if len(found) == count:
            return list(found.values())
    raise AssertionError("no namespaces on enough nodes")


def test_store_search_get_connected_delete_across_nodes(local_cluster, ctx, server, mem):
    namespaces = spread(local_cluster, ctx.keys, 3)
    ids = {ns: mem.store_many(SEED_000, namespace=ns) for ns in namespaces}
    assert drain(ctx) == 15
    for ns in namespaces:
        mem.flush(ns)
        hits = mem.search(SEED_000[0], namespace=ns, k=3)
        assert hits[0].id == ids[ns][0]
        note = mem.get(ids[ns][0], namespace=ns)
        assert note.content == SEED_000[0]
        assert {n.id for n in mem.connected(ids[ns][0], namespace=ns)} <= set(ids[ns])
        assert mem.stats(ns).notes == 5
    across = mem.search(SEED_000[1], namespace=namespaces, k=15)
    assert {h.namespace for h in across} == set(namespaces)
    gone = ids[namespaces[0]][0]
    mem.delete(gone, namespace=namespaces[0])
    mem.flush(namespaces[0])
    with pytest.raises(NotFound):
        mem.get(gone, namespace=namespaces[0])
    assert gone not in {h.id for h in mem.search(SEED_000[0], namespace=namespaces[0], k=5)}
    for ns in namespaces:
        assert check_namespace(ctx, ns) == []


def test_the_dispatcher_kicks_the_shard_a_store_lands_on(ctx, mem):
    kicked: list[int] = []
    dispatcher = Dispatcher(ctx.settings, kicked.append).start()
    try:
        deadline = time.monotonic() + 30
        mem.store("wake the dispatcher", namespace="kick")
        shard = ctx.keys.shard_of("kick")
        while shard not in kicked and time.monotonic() < deadline:
            time.sleep(0.02)
        assert shard in kicked
    finally:
        dispatcher.stop()


def test_organise_runs_every_job_on_the_cluster(ctx, cluster_settings):
    settings = cluster_settings.model_copy(update={"consolidate_min_weight": 0.2, "max_notes": 4})
    octx = WorkerContext.build(settings)
    srv = OrganiseServer(octx).start()
    try:
        with MemoryClient(settings) as mem:
            mem.store_many([SOLAR[0], OTHER[0], SOLAR[1], OTHER[1], SOLAR[2]], namespace="org")
            done = mem.organise("org")
            assert [r.job for r in done.runs] == list(JOBS)
            assert done.work["consolidate"] == 1
            assert done.work["evict"] == 2
            stats = mem.stats("org")
            assert (stats.notes, stats.tombstoned, stats.pending) == (4, 2, 0)
        assert check_namespace(octx, "org") == []
    finally:
        srv.stop()
        octx.close()


def test_eviction_tombstones_the_lowest_value_notes(local_cluster, tmp_path):
    settings = make_settings(
        tmp_path, redis_url=local_cluster.url, broker_url=session_redis_url(), max_notes=3
    )
    ctx = WorkerContext.build(settings)
    srv = SearchServer(ctx).start()
    try:
        with MemoryClient(settings) as mem:
            items = [
                {"content": c, "importance": 0.9 if i < 3 else 0.1} for i, c in enumerate(SEED_000)
            ]
            ids = mem.store_many(items, namespace="ev")
            mem.flush("ev")
            assert run_periodic(ctx, "evict") == 2
            for nid in ids[3:]:
                with pytest.raises(NotFound):
                    mem.get(nid, namespace="ev")
            assert {h.id for h in mem.search(SEED_000[3], namespace="ev", k=10)} <= set(ids[:3])
            assert (mem.stats("ev").notes, mem.stats("ev").tombstoned) == (3, 2)
        assert check_namespace(ctx, "ev") == []
    finally:
        srv.stop()
        ctx.close()


@contextmanager
def draining(workers: list[WorkerContext]) -> Iterator[list[BaseException]]:
    """Each of ``workers`` drains every shard in a thread of its own until the block ends;
    yields the list their failures go to."""
    stop = threading.Event()
    failures: list[BaseException] = []

    def work(w: WorkerContext) -> None:
        try:
            while not stop.is_set():
                if not drain(w):
                    time.sleep(0.01)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    try:
        yield failures
    finally:
        stop.set()
        for t in threads:
            t.join()


def created(ctx: WorkerContext, ns: str) -> Counter[str]:
    """How many times each note of ``ns`` was created, from its audit stream."""
    entries = ctx.redis.xrange(ctx.keys.audit(ns))
    return Counter(e[b"id"].decode() for _, e in entries if e[b"op"] == b"create")


def test_two_workers_drain_at_once_and_lose_nothing(local_cluster, cluster_settings, mem):
    namespaces = spread(local_cluster, Keys.of(cluster_settings), 3)
    ids: dict[str, list[str]] = {ns: [] for ns in namespaces}
    workers = [WorkerContext.build(cluster_settings) for _ in range(2)]
    with draining(workers) as failures:
        for i in range(20):
            for ns in namespaces:
                texts = [
                    f"{ns} note {i}-{j} on {t}" for j, t in enumerate(["redis", "slots", "tags"])
                ]
                ids[ns] += mem.store_many(texts, namespace=ns)
        deadline = time.monotonic() + 60
        while any(mem.stats(ns).notes < 60 for ns in namespaces) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert not failures
    for ns in namespaces:
        active = {m.decode() for m in workers[0].redis.zrange(workers[0].keys.active(ns), 0, -1)}
        assert active == set(ids[ns])
        assert set(created(workers[0], ns).values()) == {1}
        assert check_namespace(workers[0], ns) == []
    for w in workers:
        w.close()


def test_async_client_stores_searches_and_reads(ctx, server, cluster_settings):
    async def run() -> None:
        async with AsyncMemoryClient(cluster_settings) as mem:
            ids = await mem.store_many(SEED_000[:4], namespace="async")
            one = await mem.store(SEED_000[4], namespace="async")
            await asyncio.to_thread(drain, ctx)
            await mem.flush("async")
            assert (await mem.search(SEED_000[4], namespace="async", k=1))[0].id == one
            assert (await mem.get(ids[0], namespace="async")).content == SEED_000[0]
            assert (await mem.stats("async")).notes == 5

    asyncio.run(run())


def move_slot(cluster: LocalCluster, key: str, batch: int = 4) -> tuple[int, int]:
    """Move the slot of ``key`` to another master as ``redis-cli --cluster reshard`` does
    (SETSLOT IMPORTING/MIGRATING, MIGRATE a few keys at a time, SETSLOT NODE everywhere), slowly
    enough for writes to land meanwhile; returns (from port, to port)."""
    src_port = node_port(cluster, key)
    dst_port = next(p for p in cluster.ports if p != src_port)
    src, dst = cluster.node(src_port), cluster.node(dst_port)
    slot = int(src.execute_command("CLUSTER", "KEYSLOT", key))
    src_id, dst_id = src.execute_command("CLUSTER", "MYID"), dst.execute_command("CLUSTER", "MYID")
    dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
    while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch):
        src.execute_command("MIGRATE", "127.0.0.1", dst_port, "", 0, 5000, "KEYS", *keys)
        time.sleep(0.002)
    for port in cluster.ports:
        cluster.node(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    return src_port, dst_port


def test_moving_the_slots_of_a_namespace_being_written_and_searched_loses_nothing(
    local_cluster, ctx, cluster_settings
):
    ns, total = "moving", 400
    keys = ctx.keys
    stored: list[str] = []
    failures: list[BaseException] = []

    def produce() -> None:
        try:
            with MemoryClient(cluster_settings) as mem:
                for i in range(0, total, 4):
                    texts = [f"note {i + j} about slot {i % 7} and key {j}" for j in range(4)]
                    stored.extend(mem.store_many(texts, namespace=ns))
                    time.sleep(0.002)
        except BaseException as exc:
            failures.append(exc)

    searched: list[int] = []

    def search() -> None:
        try:
            with MemoryClient(cluster_settings) as mem:
                while producer.is_alive():
                    searched.append(len(mem.search("a note about slot 3", namespace=ns, k=5)))
        except BaseException as exc:
            failures.append(exc)

    producer, searcher = threading.Thread(target=produce), threading.Thread(target=search)
    server = SearchServer(ctx).start()
    with draining([ctx]) as drain_failures:
        producer.start()
        searcher.start()
        while len(stored) < total // 4 and producer.is_alive():
            time.sleep(0.01)
        before = len(stored)
        moves = [move_slot(local_cluster, keys.active(ns))]  # the namespace's notes and links
        moves.append(move_slot(local_cluster, keys.inbox(keys.shard_of(ns))))  # its shard stream
        meanwhile = len(stored) - before
        producer.join()
        searcher.join()
        deadline = time.monotonic() + 60
        while ctx.redis.zcard(keys.active(ns)) < total and time.monotonic() < deadline:
            time.sleep(0.05)
    server.stop()
    assert not failures and not drain_failures
    assert searched and searched[-1] == 5  # searches were answered all along
    assert all(src != dst for src, dst in moves)
    assert meanwhile > 0, "no store landed while the slots moved"
    assert node_port(local_cluster, keys.active(ns)) == moves[0][1]
    assert node_port(local_cluster, keys.inbox(keys.shard_of(ns))) == moves[1][1]
    assert len(stored) == len(set(stored)) == total
    active = {m.decode() for m in ctx.redis.zrange(keys.active(ns), 0, -1)}
    assert active == set(stored)  # 0 lost
    counts = created(ctx, ns)
    assert set(counts) == set(stored) and set(counts.values()) == {1}  # 0 applied twice
    assert int(ctx.redis.get(keys.seq(ns))) == total
    assert check_namespace(ctx, ns) == []
    assert ctx.redis.xlen(keys.inbox(keys.shard_of(ns))) == 0
