"""Fault injection: a worker SIGKILLed mid-batch loses nothing and duplicates nothing, and the
searches of the shards it drained are answered by another process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from producer import MemoryClient
from tests.e2e.workers import kill_group, stop, wait_until, worker_env
from worker.context import WorkerContext
from worker.runtime.servers import SearchServer
from worker.store.integrity import check_namespace

pytestmark = pytest.mark.e2e

N = 3000


def spawn_worker(settings) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "worker.cli.main", "worker", "--loglevel=WARNING"],
        env=worker_env(settings),
        stdout=subprocess.DEVNULL,
        start_new_session=True,  # its own process group, so kill -9 takes the pool child too
    )


def test_sigkill_mid_batch_loses_and_duplicates_nothing(settings, ctx: WorkerContext):
    with MemoryClient(settings) as mem:
        ids = []
        for start in range(0, N, 500):
            batch = range(start, start + 500)
            texts = [f"crash test note {i} on topic {i % 37} and shard work" for i in batch]
            ids += mem.store_many(texts, namespace="crash")
        victim = spawn_worker(settings)
        wait_until(lambda: mem.stats("crash").notes > 0, timeout_s=60)
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        assert mem.stats("crash").notes < N, "the kill must land mid-ingest"
        survivor = spawn_worker(settings)
        try:
            wait_until(lambda: mem.stats("crash").pending == 0, timeout_s=60)
        finally:
            stop(survivor)
        stats = mem.stats("crash")
    assert stats.notes == N
    assert int(ctx.redis.zcard(ctx.keys.active("crash"))) == N
    assert {m.decode() for m in ctx.redis.zrange(ctx.keys.active("crash"), 0, -1)} == set(ids)
    creates = [e for _, e in ctx.redis.xrange(ctx.keys.audit("crash")) if e[b"op"] == b"create"]
    assert len(creates) == N, "each note created exactly once"
    assert check_namespace(ctx, "crash") == []


def test_a_killed_workers_namespaces_are_searched_through_another_process(
    settings, ctx: WorkerContext
):
    with MemoryClient(settings) as mem:
        mem.store_many(
            [f"billing note {i} about card payments" for i in range(50)], namespace="billing"
        )
        victim = spawn_worker(settings)
        survivor = None
        try:
            mem.flush("billing", timeout_s=60)
            drainer = ctx.redis.get(ctx.keys.drainer(ctx.keys.shard_of("billing")))
            assert drainer is not None
            assert ctx.redis.exists(ctx.keys.searcher(drainer.decode()))
            survivor = SearchServer(ctx).start()
            assert mem.search("card payments", namespace="billing", fresh=False)
            assert "billing" not in ctx.projections  # the victim answered
            kill_group(victim)
            # Redis may still serve a search to the dead process's BRPOP for a moment (at most
            # once delivery: that caller would get ReplyTimeout); wait until it has noticed
            wait_until(lambda: blocked_pops(ctx) == 1, 10)  # the survivor's search thread
            hits = mem.search("card payments", namespace="billing", fresh=False, timeout_s=10)
        finally:
            if survivor is not None:
                survivor.stop()
            stop(victim)
    assert len(hits) == 10
    assert "billing" in ctx.projections


def blocked_pops(ctx: WorkerContext) -> int:
    """Clients of the test's Redis waiting in BRPOP (search threads and Celery consumers)."""
    return sum(c["cmd"] == "brpop" for c in ctx.redis.client_list())
