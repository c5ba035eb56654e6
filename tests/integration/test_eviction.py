"""Eviction through real Redis: the evicted note leaves search, the index and its neighbours."""

from __future__ import annotations

import time

import pytest

from producer import MemoryClient, NotFound
from tests.conftest import drain_all, make_settings
from tests.integration.test_store_search import SEED_000
from worker.context import WorkerContext
from worker.organise import eviction
from worker.organise.periodic import run_periodic
from worker.runtime.servers import SearchServer
from worker.store.integrity import check_namespace


def test_eviction_tombstones_the_lowest_value_notes_everywhere(redis_db, tmp_path):
    settings = make_settings(tmp_path, max_notes=3)
    ctx = WorkerContext.build(settings)
    srv = SearchServer(ctx).start()
    try:
        with MemoryClient(settings) as mem:
            ids = mem.store_many(
                [
                    {"content": c, "importance": 0.9 if i < 3 else 0.1}
                    for i, c in enumerate(SEED_000)
                ],
                namespace="ev",
            )
            mem.flush("ev")
            linked_before = {nid: set(mem.get(nid, namespace="ev").links) for nid in ids}
            assert run_periodic(ctx, "evict") == 2
            evicted = set(ids[3:])
            for nid in evicted:
                with pytest.raises(NotFound):
                    mem.get(nid, namespace="ev")
            for nid in ids[:3]:
                assert not set(mem.get(nid, namespace="ev").links) & evicted
            assert any(linked_before[n] & evicted for n in ids[:3]), "test needs a cut link"
            hits = mem.search("Snowflake PrivateLink network customer", namespace="ev", k=10)
            assert {h.id for h in hits} <= set(ids[:3])
            proj = ctx.projections["ev"]
            assert len(proj.index) == 3 and set(proj.ids.values()) == set(ids[:3])
            stats = mem.stats("ev")
            assert (stats.notes, stats.tombstoned) == (3, 2)
            assert "evict" in stats.last
        assert check_namespace(ctx, "ev") == []
        ops = [e[b"op"] for _, e in ctx.redis.xrange(ctx.keys.audit("ev"))]
        assert ops.count(b"evict") == 2
        assert run_periodic(ctx, "evict") == 0
    finally:
        srv.stop()
        ctx.close()


def test_an_eviction_slower_than_the_lease_keeps_it_and_commits(redis_db, tmp_path, monkeypatch):
    """At 1M notes reading every note's survival takes seconds, past ZQ_LEASE_S: the namespace
    lease is renewed while the job runs (it expired, and the commit raised LeaseLost, before)."""
    settings = make_settings(tmp_path, max_notes=3, lease_s=1.0)
    read = eviction._survivors

    def slow(ctx, ns):
        time.sleep(2.5)  # longer than the 1 s lease
        return read(ctx, ns)

    monkeypatch.setattr(eviction, "_survivors", slow)
    with WorkerContext.build(settings) as ctx, MemoryClient(settings) as mem:
        mem.store_many(SEED_000, namespace="slow")
        drain_all(ctx)
        assert run_periodic(ctx, "evict") == 2
        assert mem.stats("slow").notes == 3
        assert check_namespace(ctx, "slow") == []
